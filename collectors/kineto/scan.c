/* The first pass over a Kineto trace's events in C: one scan of the `traceEvents` array that
 * validates each event against the types decode.py's strict `Event` and `Args` give it, and
 * writes the fields the first pass reads into columns (collectors/kineto/scan.py loads this
 * file with ctypes and columns.py classifies what it writes).
 *
 * It holds no rule of dlpt's: what a category means, how times become nanoseconds, which
 * events are kept — all stay in Python. Strings, pids, tids and flow ids are written as
 * indices into a table of distinct raw JSON tokens, which Python decodes with msgspec once per
 * distinct token, so that a name reads exactly as the Python reader reads it.
 *
 * Where it is in any doubt it declines and the Python reader reads the trace: a value of an
 * unexpected type (the strict decode would fail and the lenient one take over), a key written
 * with escapes, a key given twice, an integer past int64, NaN or Infinity, a float past
 * 4e15 (damage, where the Python reader's column paths differ at the int64 edge), a lone
 * surrogate escape, bytes that are not UTF-8, anything that is not JSON. Declining is never
 * wrong; reading differently from the Python reader would be, and tests/test_kineto_scan.py
 * holds the two to the same columns. */
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_NONE = 0, KIND_INT = 1, KIND_FLOAT = 2 };
enum { N_ARGS = 5 }; /* correlation, Sequence number, bytes, device, stream */

typedef struct {
  /* Columns, `cap` events each, grown as events come (grow_out). */
  int32_t *ph, *cat, *name, *key, *id; /* token indices (key: a (pid, tid) pair's index) */
  int8_t *ts_kind, *dur_kind;          /* KIND_*: missing or null, int, float */
  int64_t *ts, *dur;                   /* the int, or the double's bits */
  int64_t *args;                       /* N_ARGS per event, the caller's defaults where absent */
  int64_t *off, *end;                  /* the event's bytes: [off, end) of the buffer */
  int64_t cap;
  int64_t defaults[N_ARGS];
} Out;

typedef struct {
  int64_t off;
  int32_t len;
} Token;

typedef struct {
  const uint8_t *base;
  /* distinct tokens: open addressing over indices into `tok` */
  Token *tok;
  uint64_t *tok_hash;
  int32_t ntok, tok_cap;
  int32_t *tslot;
  uint32_t tmask;
  /* distinct (pid, tid) pairs */
  int32_t *pair_pid, *pair_tid;
  uint64_t *pair_hash;
  int32_t npair, pair_cap;
  int32_t *pslot;
  uint32_t pmask;
  /* why it declined, and where */
  const char *why;
  int64_t at;
  int32_t tok_empty, tok_zero, tok_null; /* "" 0 null: what a missing field reads as */
  int32_t last[6];                       /* each field's last token: events repeat their neighbours' */
  int64_t stop;                          /* where the scan stopped: hi, or the array's closing ']' */
  Out out;
} Ctx;

/* ----- tables ----- */

/* Eight bytes a step (names are long: kernels' template names run to hundreds of bytes). */
static uint64_t hash_bytes(const uint8_t *s, int32_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x;
    memcpy(&x, s + i, 8);
    h = (h ^ x) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  uint64_t t = 0;
  memcpy(&t, s + i, (size_t)(n - i));
  h = (h ^ t) * 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 29);
}

/* *p resized to cap elements of `size` bytes; 0 when out of memory (*p left as it was). */
static int grow_array(void **p, size_t size, int64_t cap) {
  void *q = realloc(*p, size * (size_t)cap);
  if (!q) return 0;
  *p = q;
  return 1;
}

/* *slots rebuilt as open-addressing slots (-1: empty) over n items with these hashes, 2 * cap of
 * them (a power of two), *mask for indexing; 0 when out of memory. */
static int rebuild_slots(int32_t **slots, uint32_t *mask, const uint64_t *hash, int32_t n, int32_t cap) {
  uint32_t nslots = (uint32_t)cap * 2;
  int32_t *slot = malloc(sizeof(int32_t) * nslots);
  if (!slot) return 0;
  memset(slot, 0xff, sizeof(int32_t) * nslots);
  for (int32_t i = 0; i < n; ++i) {
    uint32_t j = (uint32_t)hash[i] & (nslots - 1);
    while (slot[j] >= 0) j = (j + 1) & (nslots - 1);
    slot[j] = i;
  }
  free(*slots);
  *slots = slot;
  *mask = nslots - 1;
  return 1;
}

static int grow_tokens(Ctx *c) {
  int32_t cap = c->tok_cap ? c->tok_cap * 2 : 4096;
  if (!grow_array((void **)&c->tok, sizeof(Token), cap) || !grow_array((void **)&c->tok_hash, sizeof(uint64_t), cap) ||
      !rebuild_slots(&c->tslot, &c->tmask, c->tok_hash, c->ntok, cap))
    return 0;
  c->tok_cap = cap;
  return 1;
}

/* The index of the token s[0..n) (bytes of the buffer), added if new; -1 when out of memory. */
static int32_t intern(Ctx *c, const uint8_t *s, int32_t n) {
  if (c->ntok >= c->tok_cap && !grow_tokens(c)) return -1;
  uint64_t h = hash_bytes(s, n);
  uint32_t j = (uint32_t)h & c->tmask;
  for (;;) {
    int32_t i = c->tslot[j];
    if (i < 0) break;
    /* (a missing field's tokens, offset -1, are in the slots too, and never equal) */
    if (c->tok_hash[i] == h && c->tok[i].len == n && c->tok[i].off >= 0 &&
        memcmp(c->base + c->tok[i].off, s, (size_t)n) == 0)
      return i;
    j = (j + 1) & c->tmask;
  }
  int32_t i = c->ntok++;
  c->tok[i].off = s - c->base;
  c->tok[i].len = n;
  c->tok_hash[i] = h;
  c->tslot[j] = i;
  return i;
}

/* intern, asking first whether the token is the one this field had last (ph, cat, pid and tid
 * mostly are): a compare instead of a hash. */
static int32_t intern_field(Ctx *c, int field, const uint8_t *s, int32_t n) {
  int32_t i = c->last[field];
  if (i > 2 && c->tok[i].len == n && memcmp(c->base + c->tok[i].off, s, (size_t)n) == 0) return i;
  i = intern(c, s, n);
  c->last[field] = i;
  return i;
}

static int grow_pairs(Ctx *c) {
  int32_t cap = c->pair_cap ? c->pair_cap * 2 : 256;
  if (!grow_array((void **)&c->pair_pid, sizeof(int32_t), cap) || !grow_array((void **)&c->pair_tid, sizeof(int32_t), cap) ||
      !grow_array((void **)&c->pair_hash, sizeof(uint64_t), cap) ||
      !rebuild_slots(&c->pslot, &c->pmask, c->pair_hash, c->npair, cap))
    return 0;
  c->pair_cap = cap;
  return 1;
}

static int32_t pair(Ctx *c, int32_t pid, int32_t tid) {
  if (c->npair >= c->pair_cap && !grow_pairs(c)) return -1;
  uint64_t h = ((uint64_t)(uint32_t)pid * 0x9E3779B97F4A7C15ULL) ^ (uint32_t)tid;
  h ^= h >> 31;
  uint32_t j = (uint32_t)h & c->pmask;
  for (;;) {
    int32_t i = c->pslot[j];
    if (i < 0) break;
    if (c->pair_pid[i] == pid && c->pair_tid[i] == tid) return i;
    j = (j + 1) & c->pmask;
  }
  int32_t i = c->npair++;
  c->pair_pid[i] = pid;
  c->pair_tid[i] = tid;
  c->pair_hash[i] = h;
  c->pslot[j] = i;
  return i;
}

static int grow_out(Out *o) {
  int64_t cap = o->cap ? o->cap * 2 : 65536;
  if (!grow_array((void **)&o->ph, sizeof(int32_t), cap) || !grow_array((void **)&o->cat, sizeof(int32_t), cap) ||
      !grow_array((void **)&o->name, sizeof(int32_t), cap) || !grow_array((void **)&o->key, sizeof(int32_t), cap) ||
      !grow_array((void **)&o->id, sizeof(int32_t), cap) || !grow_array((void **)&o->ts_kind, sizeof(int8_t), cap) ||
      !grow_array((void **)&o->dur_kind, sizeof(int8_t), cap) || !grow_array((void **)&o->ts, sizeof(int64_t), cap) ||
      !grow_array((void **)&o->dur, sizeof(int64_t), cap) ||
      !grow_array((void **)&o->args, sizeof(int64_t), cap * N_ARGS) ||
      !grow_array((void **)&o->off, sizeof(int64_t), cap) || !grow_array((void **)&o->end, sizeof(int64_t), cap))
    return 0;
  o->cap = cap;
  return 1;
}

static void free_out(Out *o) {
  free(o->ph), free(o->cat), free(o->name), free(o->key), free(o->id), free(o->ts_kind);
  free(o->dur_kind), free(o->ts), free(o->dur), free(o->args), free(o->off), free(o->end);
}

/* ----- JSON ----- */

typedef struct {
  const uint8_t *p, *e;
  Ctx *c;
} Cur;

static int fail(Cur *r, const char *why) {
  if (!r->c->why) {
    r->c->why = why;
    r->c->at = r->p - r->c->base;
  }
  return 0;
}

static inline void ws(Cur *r) {
  while (r->p < r->e && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t')) r->p++;
}

static int hexval(uint8_t ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

/* A string at r->p (its opening quote): r->p past its closing quote; *escaped whether it holds
 * an escape. Checks what JSON and UTF-8 require. */
static int string(Cur *r, int *escaped) {
  const uint8_t *p = r->p + 1, *e = r->e;
  *escaped = 0;
  while (p < e) {
    /* Plain ASCII bytes (no quote, backslash, control or non-ASCII byte) passed over 16 or 8
     * at a time: most of a trace's bytes are inside strings. */
#if defined(__SSE2__)
    {
      const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
      while (p + 16 <= e) {
        __m128i x = _mm_loadu_si128((const __m128i *)p);
        /* signed: bytes from 0x80 read negative, so "below 0x20" also finds non-ASCII */
        __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                                       _mm_cmplt_epi8(x, space));
        int mask = _mm_movemask_epi8(special);
        if (mask) {
          p += __builtin_ctz((unsigned)mask);
          break;
        }
        p += 16;
      }
    }
#endif
    while (p + 8 <= e) {
      uint64_t x;
      memcpy(&x, p, 8);
      const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
      uint64_t q = x ^ (ones * '"'), b = x ^ (ones * '\\');
      uint64_t special = ((q - ones) & ~q) | ((b - ones) & ~b) | ((x - ones * 0x20) & ~x) | x;
      if (special & highs) break;
      p += 8;
    }
    if (p >= e) break;
    uint8_t ch = *p;
    if (ch == '"') {
      r->p = p + 1;
      return 1;
    }
    if (ch == '\\') {
      *escaped = 1;
      if (p + 1 >= e) break;
      uint8_t x = p[1];
      if (x == 'u') {
        if (p + 6 > e) break;
        int v = 0;
        for (int k = 2; k < 6; ++k) {
          int h = hexval(p[k]);
          if (h < 0) return r->p = p, fail(r, "a bad \\u escape");
          v = v * 16 + h;
        }
        if (v >= 0xDC00 && v <= 0xDFFF) return r->p = p, fail(r, "a surrogate escape");
        if (v >= 0xD800 && v <= 0xDBFF) { /* a pair's first half: its second must follow */
          int w = 0;
          if (p + 12 > e || p[6] != '\\' || p[7] != 'u') return r->p = p, fail(r, "a surrogate escape");
          for (int k = 8; k < 12; ++k) {
            int h = hexval(p[k]);
            if (h < 0) return r->p = p, fail(r, "a bad \\u escape");
            w = w * 16 + h;
          }
          if (w < 0xDC00 || w > 0xDFFF) return r->p = p, fail(r, "a surrogate escape");
          p += 6;
        }
        p += 6;
        continue;
      }
      if (x != '"' && x != '\\' && x != '/' && x != 'b' && x != 'f' && x != 'n' && x != 'r' && x != 't')
        return r->p = p, fail(r, "a bad escape");
      p += 2;
      continue;
    }
    if (ch < 0x20) return r->p = p, fail(r, "a control character in a string");
    if (ch < 0x80) {
      ++p;
      continue;
    }
    /* UTF-8: the shortest form only, no surrogates, at most U+10FFFF */
    int n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (ch >= 0xC2 && ch <= 0xDF) n = 1;
    else if (ch == 0xE0) n = 2, lo = 0xA0;
    else if (ch >= 0xE1 && ch <= 0xEC) n = 2;
    else if (ch == 0xED) n = 2, hi = 0x9F;
    else if (ch >= 0xEE && ch <= 0xEF) n = 2;
    else if (ch == 0xF0) n = 3, lo = 0x90;
    else if (ch >= 0xF1 && ch <= 0xF3) n = 3;
    else if (ch == 0xF4) n = 3, hi = 0x8F;
    else return r->p = p, fail(r, "bytes that are not UTF-8");
    if (p + n >= e) break;
    if (p[1] < lo || p[1] > hi) return r->p = p, fail(r, "bytes that are not UTF-8");
    for (int k = 2; k <= n; ++k)
      if (p[k] < 0x80 || p[k] > 0xBF) return r->p = p, fail(r, "bytes that are not UTF-8");
    p += n + 1;
  }
  r->p = p;
  return fail(r, "a string cut short");
}

/* Clinger's fast path: a decimal whose digits make an integer below 2**53, with at most 22 of
 * them after the point and no exponent, is one exactly held integer divided by an exactly held
 * power of ten, which IEEE division rounds correctly, as strtod would. Kineto's times are such
 * (4358208933898.772: 4358208933898772 / 1e3). */
static int fast_float(const uint8_t *s, const uint8_t *e, double *out) {
  static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  int neg = *s == '-';
  const uint8_t *p = s + neg;
  uint64_t m = 0;
  int digits = 0, frac = -1;
  for (; p < e; ++p) {
    if (*p == '.') {
      frac = 0;
      continue;
    }
    if (*p < '0' || *p > '9') return 0; /* an exponent */
    if (m || *p != '0') ++digits;
    m = m * 10 + (uint64_t)(*p - '0');
    if (frac >= 0) ++frac;
    if (digits > 16) return 0; /* 16 digits stay below 2**64 for the check below */
  }
  if (frac < 0 || frac > 22 || m > (1ULL << 53)) return 0;
  double d = (double)m / pow10[frac];
  *out = neg ? -d : d;
  return 1;
}

/* A number at r->p: *kind KIND_INT (in *i) or KIND_FLOAT (in *f). */
static int number_value(Cur *r, int *kind, int64_t *i, double *f, int want);
static int number(Cur *r, int *kind, int64_t *i, double *f) { return number_value(r, kind, i, f, 1); }

/* A number at r->p whose value is not wanted (an unread field's): its grammar checked, and its
 * range where it has an exponent, as reading it would. */
static int number_skip(Cur *r) {
  int kind;
  int64_t i;
  double f;
  return number_value(r, &kind, &i, &f, 0);
}

static int number_value(Cur *r, int *kind, int64_t *i, double *f, int want) {
  const uint8_t *s = r->p, *p = r->p, *e = r->e;
  int neg = 0;
  if (p < e && *p == '-') neg = 1, ++p;
  if (p >= e || *p < '0' || *p > '9') return fail(r, "not a JSON value");
  const uint8_t *digits = p;
  if (*p == '0') {
    ++p;
    if (p < e && *p >= '0' && *p <= '9') return fail(r, "a number with a leading zero");
  } else {
    while (p < e && *p >= '0' && *p <= '9') ++p;
  }
  int isint = 1;
  if (p < e && *p == '.') {
    isint = 0;
    ++p;
    if (p >= e || *p < '0' || *p > '9') return fail(r, "a bad number");
    while (p < e && *p >= '0' && *p <= '9') ++p;
  }
  if (p < e && (*p == 'e' || *p == 'E')) {
    isint = 0;
    ++p;
    if (p < e && (*p == '+' || *p == '-')) ++p;
    if (p >= e || *p < '0' || *p > '9') return fail(r, "a bad number");
    while (p < e && *p >= '0' && *p <= '9') ++p;
  }
  if (!want) {
    /* An int of any size is a JSON int; a float without an exponent is finite. */
    int has_exp = 0;
    for (const uint8_t *q = s; q < p; ++q) has_exp |= *q == 'e' || *q == 'E';
    if (has_exp || p - s > 300) {
      char buf[400];
      if (p - s >= (long)sizeof(buf)) return fail(r, "a number too long to read here");
      memcpy(buf, s, (size_t)(p - s));
      buf[p - s] = 0;
      if (!isint && !isfinite(strtod(buf, NULL))) return fail(r, "a number past the float range");
    }
    *kind = isint ? KIND_INT : KIND_FLOAT;
    r->p = p;
    return 1;
  }
  if (isint) {
    /* int64 only: msgspec reads larger ones, which the Python reader then treats as damage */
    if (p - digits > 19) return fail(r, "an integer past int64");
    uint64_t v = 0; /* 19 digits fit in uint64 */
    for (const uint8_t *q = digits; q < p; ++q) v = v * 10 + (uint64_t)(*q - '0');
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return fail(r, "an integer past int64");
    *i = neg ? (int64_t)(0 - v) : (int64_t)v;
    *kind = KIND_INT;
  } else if (fast_float(s, p, f)) {
    *kind = KIND_FLOAT;
  } else {
    char buf[64];
    if (p - s >= (long)sizeof(buf)) return fail(r, "a number too long to read here");
    memcpy(buf, s, (size_t)(p - s));
    buf[p - s] = 0;
    double d = strtod(buf, NULL); /* glibc: correctly rounded, as msgspec's reader is */
    if (!isfinite(d)) return fail(r, "a number past the float range");
    *f = d;
    *kind = KIND_FLOAT;
  }
  r->p = p;
  return 1;
}

static int lit(Cur *r, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(r->e - r->p) < n || memcmp(r->p, w, n) != 0) return fail(r, "not a JSON value");
  r->p += n;
  return 1;
}

/* After a member or an element: ',' (1: another follows), the closing `close` (2: done), or the
 * scan declines (0). */
static int next_or_close(Cur *r, uint8_t close) {
  ws(r);
  if (r->p < r->e && *r->p == ',') return ++r->p, 1;
  if (r->p < r->e && *r->p == close) return ++r->p, 2;
  return fail(r, close == '}' ? "',' or '}' expected" : "',' or ']' expected");
}

/* At an object's '{': 2 where it is empty (passed over), 1 where a member follows, 0 where it is
 * not an object (`what`: what the scan then says). */
static int open_object(Cur *r, const char *what) {
  if (r->p >= r->e || *r->p != '{') return fail(r, what);
  ++r->p;
  ws(r);
  if (r->p < r->e && *r->p == '}') return ++r->p, 2;
  return 1;
}

/* Any JSON value, checked and passed over. */
static int skip(Cur *r, int depth) {
  if (depth > 64) return fail(r, "values nested too deep");
  ws(r);
  if (r->p >= r->e) return fail(r, "a value cut short");
  uint8_t ch = *r->p;
  int esc;
  switch (ch) {
    case '"':
      return string(r, &esc);
    case '{': {
      int open = open_object(r, "an object expected");
      if (open != 1) return open == 2;
      for (;;) {
        ws(r);
        if (r->p >= r->e || *r->p != '"') return fail(r, "an object key expected");
        if (!string(r, &esc)) return 0;
        ws(r);
        if (r->p >= r->e || *r->p != ':') return fail(r, "':' expected");
        ++r->p;
        if (!skip(r, depth + 1)) return 0;
        int k = next_or_close(r, '}');
        if (k != 1) return k == 2;
      }
    }
    case '[':
      ++r->p;
      ws(r);
      if (r->p < r->e && *r->p == ']') return ++r->p, 1;
      for (;;) {
        if (!skip(r, depth + 1)) return 0;
        int k = next_or_close(r, ']');
        if (k != 1) return k == 2;
      }
    case 't':
      return lit(r, "true");
    case 'f':
      return lit(r, "false");
    case 'n':
      return lit(r, "null");
    default:
      return number_skip(r);
  }
}

/* A key at r->p: *k, *n its bytes without quotes. Keys with escapes decline (one could spell a
 * field's name). */
static int key(Cur *r, const uint8_t **k, size_t *n) {
  int esc;
  ws(r);
  if (r->p >= r->e || *r->p != '"') return fail(r, "an object key expected");
  const uint8_t *s = r->p;
  if (!string(r, &esc)) return 0;
  if (esc) return r->p = s, fail(r, "a key with an escape");
  *k = s + 1;
  *n = (size_t)(r->p - s - 2);
  ws(r);
  if (r->p >= r->e || *r->p != ':') return fail(r, "':' expected");
  ++r->p;
  ws(r);
  return 1;
}

/* Is key k (n bytes) the literal `w`? */
#define is(k, n, w) ((n) == sizeof(w) - 1 && memcmp((k), (w), sizeof(w) - 1) == 0)

/* A string value's token. */
static int str_token(Cur *r, int field, int32_t *out) {
  int esc;
  if (r->p >= r->e || *r->p != '"') return fail(r, "a string expected");
  const uint8_t *s = r->p;
  if (!string(r, &esc)) return 0;
  *out = intern_field(r->c, field, s, (int32_t)(r->p - s));
  return *out >= 0 ? 1 : fail(r, "out of memory");
}

/* An int-or-string value's token (pid, tid, id; id may also be null). */
static int id_token(Cur *r, int field, int32_t *out, int null_ok) {
  if (r->p < r->e && *r->p == '"') return str_token(r, field, out);
  if (null_ok && r->p < r->e && *r->p == 'n') {
    if (!lit(r, "null")) return 0;
    *out = r->c->tok_null;
    return 1;
  }
  const uint8_t *s = r->p;
  int kind;
  int64_t iv;
  double fv;
  if (!number(r, &kind, &iv, &fv)) return 0;
  if (kind != KIND_INT) return r->p = s, fail(r, "a float where an int or string belongs");
  *out = intern_field(r->c, field, s, (int32_t)(r->p - s));
  return *out >= 0 ? 1 : fail(r, "out of memory");
}

/* A time (ts: null allowed; dur: not). */
static int time_value(Cur *r, int8_t *kind, int64_t *v, int null_ok) {
  if (null_ok && r->p < r->e && *r->p == 'n') {
    if (!lit(r, "null")) return 0;
    *kind = KIND_NONE;
    *v = 0;
    return 1;
  }
  int k;
  int64_t iv;
  double fv;
  const uint8_t *s = r->p;
  if (r->p >= r->e || !(*r->p == '-' || (*r->p >= '0' && *r->p <= '9'))) return fail(r, "a time that is not a number");
  if (!number(r, &k, &iv, &fv)) return 0;
  if (k == KIND_FLOAT) {
    if (fabs(fv) >= 4e15) return r->p = s, fail(r, "a time past 4e15 us");
    memcpy(v, &fv, sizeof fv);
  } else {
    if (iv >= 4000000000000000LL || iv <= -4000000000000000LL) return r->p = s, fail(r, "a time past 4e15 us");
    *v = iv;
  }
  *kind = (int8_t)k;
  return 1;
}

static int int_value(Cur *r, int64_t *v) {
  int k;
  double fv;
  const uint8_t *s = r->p;
  if (r->p >= r->e || !(*r->p == '-' || (*r->p >= '0' && *r->p <= '9'))) return fail(r, "an int expected");
  if (!number(r, &k, v, &fv)) return 0;
  if (k != KIND_INT) return r->p = s, fail(r, "a float where an int belongs");
  return 1;
}

static int str_or_null(Cur *r) {
  int esc;
  if (r->p < r->e && *r->p == 'n') return lit(r, "null");
  if (r->p >= r->e || *r->p != '"') return fail(r, "a string expected");
  return string(r, &esc);
}

/* `args`: an object or null. The five ints the first pass reads go to a[]; the other typed
 * fields are checked (the strict decode reads them) and passed over. */
static int args(Cur *r, int64_t *a) {
  if (r->p < r->e && *r->p == 'n') return lit(r, "null");
  int open = open_object(r, "args that are not an object");
  if (open != 1) return open == 2;
  unsigned seen = 0;
  const uint8_t *k;
  size_t n;
  for (;;) {
    if (!key(r, &k, &n)) return 0;
    /* the int fields: the first N_ARGS in ARG_FIELDS' order (columns.py), then those only checked */
    int which = is(k, n, "correlation") ? 0 : is(k, n, "Sequence number") ? 1 : is(k, n, "bytes") ? 2
              : is(k, n, "device") ? 3 : is(k, n, "stream") ? 4 : is(k, n, "Addr") ? 5 : is(k, n, "Bytes") ? 6
              : is(k, n, "Device Type") ? 7 : is(k, n, "Device Id") ? 8 : is(k, n, "Total Allocated") ? 9
              : is(k, n, "Total Reserved") ? 10 : -1;
    int strfield = which < 0 && (is(k, n, "name") || is(k, n, "labels"));
    int bit = which >= 0 ? which : strfield ? (is(k, n, "name") ? 11 : 12) : -1;
    if (bit >= 0) {
      if (seen & (1u << bit)) return fail(r, "a field given twice");
      seen |= 1u << bit;
    }
    if (which >= 0) {
      int64_t v;
      if (!int_value(r, &v)) return 0;
      if (which < N_ARGS) a[which] = v;
    } else if (strfield) {
      if (!str_or_null(r)) return 0;
    } else if (!skip(r, 2)) {
      return 0;
    }
    int more = next_or_close(r, '}');
    if (more != 1) return more == 2;
  }
}

static int event(Cur *r, Out *o, int64_t i) {
  Ctx *c = r->c;
  o->off[i] = r->p - c->base;
  int32_t ph = c->tok_empty, cat = c->tok_empty, name = c->tok_empty, id = c->tok_null;
  int32_t pid = c->tok_zero, tid = c->tok_zero;
  int8_t ts_kind = KIND_NONE, dur_kind = KIND_INT;
  int64_t ts = 0, dur = 0;
  int64_t *a = o->args + i * N_ARGS;
  for (int j = 0; j < N_ARGS; ++j) a[j] = o->defaults[j];
  int open = open_object(r, "an event that is not an object");
  if (!open) return 0;
  if (open == 1) {
    unsigned seen = 0;
    const uint8_t *k;
    size_t n;
    for (;;) {
      if (!key(r, &k, &n)) return 0;
      int bit = -1, ok;
      if (is(k, n, "ph")) bit = 0, ok = str_token(r, 0, &ph);
      else if (is(k, n, "cat")) bit = 1, ok = str_token(r, 1, &cat);
      else if (is(k, n, "name")) bit = 2, ok = str_token(r, 2, &name);
      else if (is(k, n, "pid")) bit = 3, ok = id_token(r, 3, &pid, 0);
      else if (is(k, n, "tid")) bit = 4, ok = id_token(r, 4, &tid, 0);
      else if (is(k, n, "ts")) bit = 5, ok = time_value(r, &ts_kind, &ts, 1);
      else if (is(k, n, "dur")) bit = 6, ok = time_value(r, &dur_kind, &dur, 0);
      else if (is(k, n, "id")) bit = 7, ok = id_token(r, 5, &id, 1);
      else if (is(k, n, "args")) bit = 8, ok = args(r, a);
      else ok = skip(r, 1);
      if (!ok) return 0;
      if (bit >= 0) {
        if (seen & (1u << bit)) return fail(r, "a field given twice");
        seen |= 1u << bit;
      }
      int more = next_or_close(r, '}');
      if (more == 0) return 0;
      if (more == 2) break;
    }
  }
  int32_t kp = pair(c, pid, tid);
  if (kp < 0) return fail(r, "out of memory");
  o->ph[i] = ph;
  o->cat[i] = cat;
  o->name[i] = name;
  o->key[i] = kp;
  o->id[i] = id;
  o->ts_kind[i] = ts_kind;
  o->ts[i] = ts;
  o->dur_kind[i] = dur_kind;
  o->dur[i] = dur;
  o->end[i] = r->p - c->base;
  return 1;
}

/* ----- the interface (scan.py) ----- */

void dlpt_scan_free(void *h) {
  Ctx *c = h;
  if (!c) return;
  free(c->tok);
  free(c->tok_hash);
  free(c->tslot);
  free(c->pair_pid);
  free(c->pair_tid);
  free(c->pair_hash);
  free(c->pslot);
  free_out(&c->out);
  free(c);
}

/* Tokens 0, 1 and 2 are what a missing field reads as: "", 0 and null (offset -1: not in the
 * buffer; scan.py knows them by index). */
void *dlpt_scan_new(void) {
  Ctx *c = calloc(1, sizeof(Ctx));
  if (!c || !grow_tokens(c)) return dlpt_scan_free(c), NULL;
  for (int32_t i = 0; i < 3; ++i) c->tok[i].off = -1, c->tok[i].len = 0, c->tok_hash[i] = 0;
  c->ntok = 3;
  c->tok_empty = 0, c->tok_zero = 1, c->tok_null = 2;
  return c;
}

/* The events of buf[lo, hi) (a JSON array's contents, without its brackets; or more, up to and
 * past its closing bracket, where the scan stops: dlpt_scan_stop) into the columns
 * (dlpt_scan_out): how many; -1 when it declines (dlpt_scan_why says why). `defaults`: what
 * each of the N_ARGS args fields reads as where an event does not give it. */
int64_t dlpt_scan(void *h, const uint8_t *buf, int64_t lo, int64_t hi, const int64_t *defaults) {
  Ctx *c = h;
  Out *o = &c->out;
  memcpy(o->defaults, defaults, sizeof(o->defaults));
  c->base = buf;
  c->why = NULL;
  for (int f = 0; f < 6; ++f) c->last[f] = 0;
  Cur r = {buf + lo, buf + hi, c};
  int64_t n = 0;
  c->stop = hi;
  ws(&r);
  /* A ']' where an event or a ',' may come is the array's end: the bytes given may run past it
   * (scan.py: the caller's guess at the end can be a later value's bracket). */
  if (r.p == r.e) return 0;
  if (*r.p == ']') return c->stop = r.p - buf, 0;
  for (;;) {
    if (n >= o->cap && !grow_out(o)) return fail(&r, "out of memory"), -1;
    if (!event(&r, o, n)) return -1;
    ++n;
    ws(&r);
    if (r.p == r.e) return n;
    if (*r.p == ']') return c->stop = r.p - buf, n;
    if (*r.p != ',') return fail(&r, "',' expected between events"), -1;
    ++r.p;
    ws(&r);
  }
}

int64_t dlpt_scan_stop(void *h) { return ((Ctx *)h)->stop; }

const char *dlpt_scan_why(void *h, int64_t *at) {
  Ctx *c = h;
  *at = c->at;
  return c->why ? c->why : "";
}

const Out *dlpt_scan_out(void *h) { return &((Ctx *)h)->out; }

int32_t dlpt_scan_ntokens(void *h) { return ((Ctx *)h)->ntok; }
int32_t dlpt_scan_npairs(void *h) { return ((Ctx *)h)->npair; }

void dlpt_scan_tokens(void *h, int64_t *off, int32_t *len) {
  Ctx *c = h;
  for (int32_t i = 0; i < c->ntok; ++i) off[i] = c->tok[i].off, len[i] = c->tok[i].len;
}

void dlpt_scan_pairs(void *h, int32_t *pid, int32_t *tid) {
  Ctx *c = h;
  memcpy(pid, c->pair_pid, sizeof(int32_t) * (size_t)c->npair);
  memcpy(tid, c->pair_tid, sizeof(int32_t) * (size_t)c->npair);
}
