"""Viewers: everything a person looks at — the TUI, text reports and exporters."""
