"""Adapters from a profile to other libraries' objects: pandas tables (`tables`), hatchet
GraphFrames (`graphframe`), networkx call graphs (`callgraph`). The model never imports them
at module level: `Profile.to_dataframe()` and its siblings import them when called, so that
opening a profile costs no pandas, hatchet or networkx import."""
