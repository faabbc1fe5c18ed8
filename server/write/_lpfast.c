/* server.write._lpfast: the C first attempt of server.write.line_protocol.parse_lines.
 *
 * Contract: parse(body, mult, default_time) returns None ("fall back") unless EVERY line of
 * the request is good, in which case it returns exactly what the Python parser would build,
 * as plain buffers:
 *
 *     [(table name, rows, unique_keys, [(column, kind, values, offsets, validity, null_count)],
 *       time values), ...]
 *
 * tables in first-seen order; columns tags first then fields, each sorted by name (UTF-8 byte
 * order is code point order, so this is Python's sorted()); kind 0 tag (string), 1 float64,
 * 2 int64, 3 uint64, 4 string field, 5 boolean.  values/offsets/validity are `Buffer` objects
 * (read-only buffer protocol, owning malloc'd memory: Arrow uses them without a copy); offsets
 * only for strings (int32), validity None when the column has no null.  unique_keys is True iff
 * no two rows of the table share (tag set, timestamp).
 *
 * The grammar is that of server/write/line_protocol.py (its module docstring; the reference is its
 * full parser `_parse_line`, the line splitting of `_run`/`_split_state`/`_trim_leading` and the
 * write-step checks of `_Request._check`), applied to UTF-8 bytes: every delimiter is ASCII and
 * no byte of a multi-byte UTF-8 sequence is ASCII, so scanning bytes is scanning characters.
 * Anything the Python path would report as an error (any bad line, a column type conflict, invalid
 * UTF-8) makes this return None, and so does what this module leaves to Python (invalid UTF-8
 * even where Python ignores it, in a comment; a string column over 2 GiB; a table of 2^31 rows or
 * more; allocation failure): the Python path then produces the result and its errors.
 *
 * The scan runs without the GIL (only malloc'd memory and the immutable body are touched); the
 * floats that need correct rounding beyond the exact fast path (Clinger: <= 2^53 mantissa and a
 * power of ten <= 1e22) are converted afterwards, with the GIL, by PyOS_string_to_double, which
 * is what Python's float() uses.  Runs of name bytes, digits and the line splitter's tokens are
 * found 16 bytes at a time with SSE2 where available (reading past a line's end, never past the
 * body's), byte by byte otherwise.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define MAX_NAME 65536  /* server.write.line_protocol.MAX_NAME_BYTES */
#define NGUESS 32       /* per table: column guesses by position in the line */

enum { K_TAG = 0, K_FLOAT = 1, K_INT = 2, K_UINT = 3, K_STR = 4, K_BOOL = 5 };

/* parse results */
#define OK 0
#define BAD (-1) /* the line is invalid or not handled here: fall back */
#define NOMEM (-2)

/* --------------------------------------------------------------------------------------------
 * character classes (IOx escape_or_fallback runs)
 * ------------------------------------------------------------------------------------------ */

static const unsigned char MEAS_STOP[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1, [0] = 1, [','] = 1, ['\\'] = 1};
static const unsigned char KEY_STOP[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1, ['='] = 1, ['\\'] = 1};
static const unsigned char TAGVAL_STOP[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1, [','] = 1, ['\\'] = 1};
static const unsigned char MEAS_ESC[256] = {[','] = 1, [' '] = 1, ['\\'] = 1};
static const unsigned char KEY_ESC[256] = {[','] = 1, [' '] = 1, ['\\'] = 1, ['='] = 1};
/* bytes that matter to the line splitter */
static const unsigned char SPLIT_TOKEN[256] = {['\n'] = 1, ['\\'] = 1, [' '] = 1, ['"'] = 1, ['='] = 1, [','] = 1};

#define IS_DIGIT(c) ((unsigned char)((c) - '0') < 10)

/* --------------------------------------------------------------------------------------------
 * growable buffers
 * ------------------------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

/* cap >= need; the bytes past the old capacity are zeroed when `zero` (bitmaps rely on it) */
static int buf_reserve(Buf *b, size_t need, int zero) {
    if (need <= b->cap) return OK;
    size_t nc = b->cap ? b->cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return NOMEM;
        nc *= 2;
    }
    char *q = realloc(b->p, nc);
    if (q == NULL) return NOMEM;
    if (zero) memset(q + b->cap, 0, nc - b->cap);
    b->p = q;
    b->cap = nc;
    return OK;
}

static void buf_free(Buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* bitmap of at least nbits bits (bytes past len are always zero) */
static int bits_ensure(Buf *b, int64_t nbits) {
    size_t need = (size_t)((nbits + 7) / 8);
    if (need > b->len) {
        if (buf_reserve(b, need, 1) < 0) return NOMEM;
        b->len = need;
    }
    return OK;
}

static inline void bit_set(Buf *b, int64_t i) { ((unsigned char *)b->p)[i >> 3] |= (unsigned char)(1u << (i & 7)); }
static inline void bit_clear(Buf *b, int64_t i) { ((unsigned char *)b->p)[i >> 3] &= (unsigned char)~(1u << (i & 7)); }
static inline int bit_get(const Buf *b, int64_t i) { return (((const unsigned char *)b->p)[i >> 3] >> (i & 7)) & 1; }

/* --------------------------------------------------------------------------------------------
 * hashing and name maps
 * ------------------------------------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL), w;
    for (; n >= 8; n -= 8, p += 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
        h ^= h >> 29;
    }
    if (n) {
        w = 0;
        memcpy(&w, p, n);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    }
    return mix64(h);
}

/* a == b for n bytes (names are short: cheaper than a memcmp call; overlapping loads) */
static ALWAYS_INLINE int same_bytes(const char *a, const char *b, size_t n) {
    uint64_t x, y;
    if (n >= 8) {
        for (size_t i = 0; i + 8 < n; i += 8) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (x != y) return 0;
        }
        memcpy(&x, a + n - 8, 8);
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    if (n >= 4) {
        uint32_t u, v, u2, v2;
        memcpy(&u, a, 4);
        memcpy(&v, b, 4);
        memcpy(&u2, a + n - 4, 4);
        memcpy(&v2, b + n - 4, 4);
        return u == v && u2 == v2;
    }
    for (; n; n--) {
        if (*a++ != *b++) return 0;
    }
    return 1;
}

/* the first member of Table and Col: what a Map compares */
typedef struct {
    char *p;
    size_t len;
    uint64_t hash;
} Name;

typedef struct {
    int32_t *slot; /* index + 1, 0 = empty */
    size_t cap;    /* power of two (0: not allocated) */
    size_t count;
} Map;

#define NAME_AT(base, stride, i) ((const Name *)((const char *)(base) + (size_t)(i) * (stride)))

/* Doubles the capacity *cap (8 at first) of the array *p of elements of `size` bytes; 0 on success,
   -1 when out of memory or the count would overflow (then *p and *cap are unchanged). */
static int grow_array(void **p, int32_t *cap, size_t size) {
    if (*cap > INT32_MAX / 2) return -1;
    int32_t nc = *cap ? *cap * 2 : 8;
    if ((size_t)nc > SIZE_MAX / size) return -1;
    void *np = realloc(*p, (size_t)nc * size);
    if (np == NULL) return -1;
    *p = np;
    *cap = nc;
    return 0;
}

static int32_t map_find(const Map *m, const void *base, size_t stride, uint64_t h, const char *k, size_t kl) {
    if (m->cap == 0) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        int32_t s = m->slot[i];
        if (s == 0) return -1;
        const Name *nm = NAME_AT(base, stride, s - 1);
        if (nm->hash == h && nm->len == kl && memcmp(nm->p, k, kl) == 0) return s - 1;
    }
}

/* adds entry idx (its Name already set); entries 0..count-1 are in the map */
static int map_add(Map *m, const void *base, size_t stride, int32_t idx) {
    if ((m->count + 1) * 2 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 16;
        int32_t *ns = calloc(nc, sizeof(int32_t));
        if (ns == NULL) return NOMEM;
        for (size_t j = 0; j < m->cap; j++) {
            int32_t s = m->slot[j];
            if (s == 0) continue;
            size_t i = (size_t)NAME_AT(base, stride, s - 1)->hash & (nc - 1);
            while (ns[i]) i = (i + 1) & (nc - 1);
            ns[i] = s;
        }
        free(m->slot);
        m->slot = ns;
        m->cap = nc;
    }
    size_t mask = m->cap - 1;
    size_t i = (size_t)NAME_AT(base, stride, idx)->hash & mask;
    while (m->slot[i]) i = (i + 1) & mask;
    m->slot[i] = idx + 1;
    m->count++;
    return OK;
}

/* --------------------------------------------------------------------------------------------
 * columns and tables
 * ------------------------------------------------------------------------------------------ */

typedef struct {
    Name name;
    int kind;
    int64_t n;     /* rows materialised (written or null-padded) */
    Buf val;       /* 8 bytes a row; boolean: bitmap; string: UTF-8 data */
    Buf off;       /* string: int32 offsets, n + 1 */
    Buf valid;     /* bitmap, once the first null appears (has_valid) */
    int has_valid;
    int64_t nulls;
} Col;

typedef struct {
    Name name;
    Col *cols;
    int32_t ncols, capcols;
    Map colmap;
    int64_t nrows;
    Buf time;
    int unique;
    int32_t tag_guess[NGUESS], field_guess[NGUESS];
} Table;

typedef struct {
    int32_t table, col;
    int64_t row;
    const char *p;
    size_t len; /* 0: cancelled (a later value of the same field in the line won) */
} Pending;

typedef struct {
    const char *body;
    Py_ssize_t n;
    int64_t mult, deftime;
    Table *tables;
    int32_t ntables, captables;
    Map tmap;
    int32_t last_table;
    Buf skey, sval; /* scratch for unescaped names / values (each >= the line's length) */
    Pending *pend;
    size_t npend, cappend;
} Ctx;

static void col_free(Col *c) {
    free(c->name.p);
    buf_free(&c->val);
    buf_free(&c->off);
    buf_free(&c->valid);
}

static void ctx_free(Ctx *x) {
    for (int32_t t = 0; t < x->ntables; t++) {
        Table *tb = &x->tables[t];
        for (int32_t c = 0; c < tb->ncols; c++) col_free(&tb->cols[c]);
        free(tb->cols);
        free(tb->colmap.slot);
        free(tb->name.p);
        buf_free(&tb->time);
    }
    free(x->tables);
    free(x->tmap.slot);
    buf_free(&x->skey);
    buf_free(&x->sval);
    free(x->pend);
}

static char *copy_name(const char *k, size_t kl) {
    char *p = malloc(kl ? kl : 1);
    if (p != NULL && kl) memcpy(p, k, kl);
    return p;
}

/* the column is null from row c->n up to (excluding) row r */
static int col_pad(Col *c, int64_t r) {
    if (c->n >= r) return OK;
    int64_t k = r - c->n;
    if (!c->has_valid) {
        if (bits_ensure(&c->valid, r) < 0) return NOMEM;
        memset(c->valid.p, 0xFF, (size_t)(c->n / 8)); /* rows 0..n-1 were all valid */
        for (int64_t i = c->n / 8 * 8; i < c->n; i++) bit_set(&c->valid, i);
        c->has_valid = 1;
    } else if (bits_ensure(&c->valid, r) < 0) {
        return NOMEM;
    }
    c->nulls += k;
    switch (c->kind) {
    case K_TAG:
    case K_STR: {
        if (buf_reserve(&c->off, (size_t)(r + 1) * 4, 0) < 0) return NOMEM;
        int32_t *off = (int32_t *)c->off.p;
        int32_t last = off[c->n];
        for (int64_t i = c->n + 1; i <= r; i++) off[i] = last;
        c->off.len = (size_t)(r + 1) * 4;
        break;
    }
    case K_BOOL:
        if (bits_ensure(&c->val, r) < 0) return NOMEM;
        break;
    default:
        if (buf_reserve(&c->val, (size_t)r * 8, 0) < 0) return NOMEM;
        memset(c->val.p + c->val.len, 0, (size_t)r * 8 - c->val.len);
        c->val.len = (size_t)r * 8;
    }
    c->n = r;
    return OK;
}

/* makes row r the column's current row: pads nulls before it, marks it valid */
static int col_begin_row(Col *c, int64_t r) {
    if (col_pad(c, r) < 0) return NOMEM;
    if (c->has_valid) {
        if (bits_ensure(&c->valid, r + 1) < 0) return NOMEM;
        bit_set(&c->valid, r);
    }
    c->n = r + 1;
    return OK;
}

/* string value of row r; `again`: the row already has a value (a repeated field: the last wins) */
static int col_set_str(Col *c, int64_t r, const char *v, size_t vl, int again) {
    if (!again && col_begin_row(c, r) < 0) return NOMEM;
    int32_t *off = (int32_t *)c->off.p;
    size_t start = (size_t)off[r];
    if (vl > (size_t)INT32_MAX - start) return BAD; /* over 2 GiB: Python's business */
    if (buf_reserve(&c->val, start + vl, 0) < 0) return NOMEM;
    if (vl) memcpy(c->val.p + start, v, vl);
    c->val.len = start + vl;
    if (!again && buf_reserve(&c->off, (size_t)(r + 2) * 4, 0) < 0) return NOMEM;
    off = (int32_t *)c->off.p;
    off[r + 1] = (int32_t)(start + vl);
    c->off.len = (size_t)(r + 2) * 4;
    return OK;
}

static int col_set_8(Col *c, int64_t r, const void *v, int again) {
    if (!again) {
        if (col_begin_row(c, r) < 0) return NOMEM;
        if (buf_reserve(&c->val, (size_t)(r + 1) * 8, 0) < 0) return NOMEM;
        c->val.len = (size_t)(r + 1) * 8;
    }
    memcpy(c->val.p + (size_t)r * 8, v, 8);
    return OK;
}

static int col_set_bool(Col *c, int64_t r, int v, int again) {
    if (!again && col_begin_row(c, r) < 0) return NOMEM;
    if (bits_ensure(&c->val, r + 1) < 0) return NOMEM;
    if (v) bit_set(&c->val, r);
    else bit_clear(&c->val, r);
    return OK;
}

static Table *get_table(Ctx *x, const char *k, size_t kl, int *err) {
    if (x->last_table >= 0) {
        Table *t = &x->tables[x->last_table];
        if (t->name.len == kl && same_bytes(t->name.p, k, kl)) return t;
    }
    uint64_t h = hash_bytes(k, kl);
    int32_t i = map_find(&x->tmap, x->tables, sizeof(Table), h, k, kl);
    if (i < 0) {
        if (x->ntables == x->captables && grow_array((void **)&x->tables, &x->captables, sizeof(Table)) < 0)
            goto nomem;
        Table *t = &x->tables[x->ntables];
        memset(t, 0, sizeof(Table));
        for (int g = 0; g < NGUESS; g++) t->tag_guess[g] = t->field_guess[g] = -1;
        t->name.p = copy_name(k, kl);
        if (t->name.p == NULL) goto nomem;
        t->name.len = kl;
        t->name.hash = h;
        i = x->ntables++;
        if (map_add(&x->tmap, x->tables, sizeof(Table), i) < 0) goto nomem;
    }
    x->last_table = i;
    return &x->tables[i];
nomem:
    *err = NOMEM;
    return NULL;
}

static int32_t find_col(Table *t, const char *k, size_t kl, int kind, int32_t *guess);

/* the column `k` of kind `kind` (created if new): its index, BAD on a (role, type) conflict or
 * a new column named "time", NOMEM.  First guess: the column at this position in the table's
 * previous line. */
static ALWAYS_INLINE int32_t get_col(Table *t, const char *k, size_t kl, int kind, int32_t *guess) {
    int32_t g = guess != NULL ? *guess : -1;
    if (g >= 0) {
        Col *c = &t->cols[g];
        if (c->name.len == kl && same_bytes(c->name.p, k, kl)) return c->kind == kind ? g : BAD;
    }
    return find_col(t, k, kl, kind, guess);
}

static int32_t find_col(Table *t, const char *k, size_t kl, int kind, int32_t *guess) {
    int32_t g;
    uint64_t h = hash_bytes(k, kl);
    g = map_find(&t->colmap, t->cols, sizeof(Col), h, k, kl);
    if (g < 0) {
        if (kl == 4 && memcmp(k, "time", 4) == 0) return BAD;
        if (t->ncols == t->capcols && grow_array((void **)&t->cols, &t->capcols, sizeof(Col)) < 0) return NOMEM;
        Col *c = &t->cols[t->ncols];
        memset(c, 0, sizeof(Col));
        c->kind = kind;
        c->name.p = copy_name(k, kl);
        if (c->name.p == NULL) return NOMEM;
        c->name.len = kl;
        c->name.hash = h;
        g = t->ncols++;
        if (kind == K_TAG || kind == K_STR) {
            if (buf_reserve(&c->off, 64, 0) < 0) return NOMEM;
            ((int32_t *)c->off.p)[0] = 0;
            c->off.len = 4;
        }
        if (map_add(&t->colmap, t->cols, sizeof(Col), g) < 0) return NOMEM;
    }
    if (guess != NULL) *guess = g;
    return t->cols[g].kind == kind ? g : BAD;
}

/* --------------------------------------------------------------------------------------------
 * scanning one logical line
 * ------------------------------------------------------------------------------------------ */

/* The first byte in [p, e) of `stop` (space, tab, newline, backslash, `delim`, and NUL when
 * `nul`), or e.  SSE2 reads 16 bytes at a time up to `lim` (the body's end: bytes past the line
 * are readable, a stop byte found there counts as e). */
static ALWAYS_INLINE const char *run_end(const char *p, const char *e, const char *lim, const unsigned char *stop,
                                         char delim, int nul) {
#ifdef __SSE2__
    const __m128i sp = _mm_set1_epi8(' '), tb = _mm_set1_epi8('\t'), nl = _mm_set1_epi8('\n'),
                  bs = _mm_set1_epi8('\\'), dl = _mm_set1_epi8(delim);
    while (p < e && lim - p >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)p);
        __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, sp), _mm_cmpeq_epi8(x, tb)),
                                 _mm_or_si128(_mm_cmpeq_epi8(x, nl), _mm_cmpeq_epi8(x, bs)));
        m = _mm_or_si128(m, _mm_cmpeq_epi8(x, dl));
        if (nul) m = _mm_or_si128(m, _mm_cmpeq_epi8(x, _mm_setzero_si128()));
        unsigned mask = (unsigned)_mm_movemask_epi8(m);
        if (mask) {
            const char *q = p + __builtin_ctz(mask);
            return q < e ? q : e;
        }
        p += 16;
    }
    if (p >= e) return e;
#else
    (void)lim; (void)delim; (void)nul;
#endif
    while (p < e && !stop[(unsigned char)*p]) p++;
    return p;
}

/* the end of the run of ASCII digits at p (as run_end) */
static ALWAYS_INLINE const char *digits_end(const char *p, const char *e, const char *lim) {
#ifdef __SSE2__
    const __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8(9);
    while (p < e && lim - p >= 16) {
        __m128i t = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)p), zero);
        unsigned mask = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(t, nine), t)) & 0xFFFFu;
        if (mask) {
            const char *q = p + __builtin_ctz(mask);
            return q < e ? q : e;
        }
        p += 16;
    }
    if (p >= e) return e;
#else
    (void)lim;
#endif
    while (p < e && IS_DIGIT(*p)) p++;
    return p;
}

static int scan_escaped(const char **pp, const char *start, const char *p, const char *e, const unsigned char *stop,
                        const unsigned char *esc, char *scratch, const char **out, size_t *outlen);

/* IOx escape_or_fallback over [*pp, e): 1 and the unescaped name (in the body, or in `scratch`
 * when it holds an escape), 0 when empty, BAD when it ends with a backslash or is over 64 KiB */
static ALWAYS_INLINE int scan_name(const char **pp, const char *e, const char *lim, const unsigned char *stop,
                                   char delim, int nul, const unsigned char *esc, char *scratch, const char **out,
                                   size_t *outlen) {
    const char *start = *pp;
    const char *p = run_end(start, e, lim, stop, delim, nul);
    if (p >= e || *p != '\\') {
        size_t len = (size_t)(p - start);
        if (len == 0) return 0;
        if (len > MAX_NAME) return BAD;
        *out = start;
        *outlen = len;
        *pp = p;
        return 1;
    }
    return scan_escaped(pp, start, p, e, stop, esc, scratch, out, outlen);
}

/* scan_name's slow path: the run [start, p) is followed by a backslash */
static int scan_escaped(const char **pp, const char *start, const char *p, const char *e, const unsigned char *stop,
                        const unsigned char *esc, char *scratch, const char **out, size_t *outlen) {
    char *w = scratch;
    memcpy(w, start, (size_t)(p - start));
    w += p - start;
    for (;;) {
        while (p < e && !stop[(unsigned char)*p]) *w++ = *p++;
        if (p < e && *p == '\\') {
            if (p + 1 < e) {
                if (esc[(unsigned char)p[1]]) {
                    *w++ = p[1];
                } else { /* unknown escape: the backslash and the next byte stay */
                    *w++ = '\\';
                    *w++ = p[1];
                }
                p += 2;
                continue;
            }
            *w++ = '\\';
            p++;
            break;
        }
        break;
    }
    size_t len = (size_t)(w - scratch);
    if (scratch[len - 1] == '\\' || len > MAX_NAME) return BAD;
    *out = scratch;
    *outlen = len;
    *pp = p;
    return 1;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR_DIGITS 1
/* the 8 ASCII digits at p as a number (SWAR, the first digit in the lowest byte) */
static inline uint64_t parse8(const char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    v -= 0x3030303030303030ULL;
    v = (v * 10) + (v >> 8);
    v = (((v & 0x000000FF000000FFULL) * 0x000F424000000064ULL) +
         (((v >> 16) & 0x000000FF000000FFULL) * 0x0000271000000001ULL)) >> 32;
    return v;
}
#endif

/* magnitude of the decimal digits [d, de), BAD above `limit` */
static int parse_mag(const char *d, const char *de, uint64_t limit, uint64_t *out) {
    while (d < de && *d == '0') d++;
    size_t nd = (size_t)(de - d);
    if (nd > 20) return BAD;
    const char *he = d + (nd > 19 ? 19 : nd); /* 19 digits never overflow */
    uint64_t v = 0;
#ifdef SWAR_DIGITS
    for (; he - d >= 8; d += 8) v = v * 100000000ULL + parse8(d);
#endif
    for (; d < he; d++) v = v * 10 + (uint64_t)(*d - '0');
    if (nd == 20) {
        unsigned dig = (unsigned)(*d - '0');
        if (v > (UINT64_MAX - dig) / 10) return BAD;
        v = v * 10 + dig;
    }
    if (v > limit) return BAD;
    *out = v;
    return OK;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* the float literal [p, e) (-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?, already matched): 1 and the
 * correctly rounded value when the exact fast path applies, 0 when it needs PyOS_string_to_double */
static int fast_float(const char *p, const char *e, double *out) {
#if FLT_EVAL_METHOD != 0 || DBL_MANT_DIG != 53
    (void)p; (void)e; (void)out;
    return 0;
#else
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    uint64_t m = 0;
    int nd = 0;
    int64_t e10 = 0;
    for (; p < e && IS_DIGIT(*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (m == 0 && d == 0) continue;
        if (nd < 19) {
            m = m * 10 + d;
            nd++;
        } else {
            if (d) return 0;
            e10++;
        }
    }
    if (p < e && *p == '.') {
        for (p++; p < e && IS_DIGIT(*p); p++) {
            unsigned d = (unsigned)(*p - '0');
            if (m == 0 && d == 0) {
                e10--;
                continue;
            }
            if (nd < 19) {
                m = m * 10 + d;
                nd++;
                e10--;
            } else if (d) {
                return 0;
            }
        }
    }
    if (p < e) { /* [eE][+-]?[0-9]+ */
        p++;
        int eneg = 0;
        if (*p == '+' || *p == '-') {
            eneg = *p == '-';
            p++;
        }
        int64_t x = 0;
        for (; p < e; p++) {
            if (x < 1000000) x = x * 10 + (*p - '0');
        }
        e10 += eneg ? -x : x;
    }
    double v;
    if (m == 0) {
        v = 0.0;
    } else {
        while (m > (1ULL << 53) && m % 10 == 0) {
            m /= 10;
            e10++;
        }
        if (m > (1ULL << 53) || e10 < -22 || e10 > 22) return 0;
        v = e10 >= 0 ? (double)m * POW10[e10] : (double)m / POW10[-e10];
    }
    *out = neg ? -v : v;
    return 1;
#endif
}

/* one logical line [s, e): non-empty, leading whitespace and comments removed, trailing "\r" removed */
static int parse_line(Ctx *x, const char *s, const char *e) {
    const char *lim = x->body + x->n;
    size_t L = (size_t)(e - s);
    if (buf_reserve(&x->skey, L, 0) < 0 || buf_reserve(&x->sval, L, 0) < 0) return NOMEM;
    const char *p = s, *k, *v;
    size_t kl, vl;
    int r, err = OK;

    if (scan_name(&p, e, lim, MEAS_STOP, ',', 1, MEAS_ESC, x->skey.p, &k, &kl) <= 0) return BAD;
    Table *t = get_table(x, k, kl, &err);
    if (t == NULL) return err;
    int32_t ti = (int32_t)(t - x->tables);
    int64_t row = t->nrows;

    if (p < e && *p == ',') {
        for (int i = 0;; i++) {
            p++;
            if (scan_name(&p, e, lim, KEY_STOP, '=', 0, KEY_ESC, x->skey.p, &k, &kl) <= 0) return BAD;
            if (p >= e || *p != '=') return BAD;
            int32_t ci = get_col(t, k, kl, K_TAG, i < NGUESS ? &t->tag_guess[i] : NULL);
            if (ci < 0) return ci;
            p++;
            if (scan_name(&p, e, lim, TAGVAL_STOP, ',', 0, KEY_ESC, x->sval.p, &v, &vl) <= 0) return BAD;
            Col *c = &t->cols[ci];
            if (c->n > row) return BAD; /* a tag key repeated in the line */
            if ((r = col_set_str(c, row, v, vl, 0)) < 0) return r;
            if (p >= e || *p != ',') break;
        }
    }
    if (p >= e || *p != ' ') return BAD;
    while (p < e && *p == ' ') p++;

    for (int i = 0;; i++) {
        if (scan_name(&p, e, lim, KEY_STOP, '=', 0, KEY_ESC, x->skey.p, &k, &kl) <= 0) return BAD;
        if (p >= e || *p != '=') return BAD;
        p++;
        if (p >= e) return BAD;
        int kind;
        union {
            double f;
            int64_t i;
            uint64_t u;
        } num;
        int bval = 0, pending = 0;
        const char *tok = p;
        unsigned char c0 = (unsigned char)*p;
        if (c0 == '-' || IS_DIGIT(c0)) {
            const char *q = p;
            int neg = 0;
            if (*q == '-') {
                neg = 1;
                q++;
            }
            const char *ds = q;
            q = digits_end(q, e, lim);
            if (q == ds) return BAD;
            if (q < e && *q == 'i') {
                uint64_t mag;
                if (parse_mag(ds, q, neg ? (1ULL << 63) : (1ULL << 63) - 1, &mag) < 0) return BAD;
                num.i = neg ? (int64_t)(0 - mag) : (int64_t)mag;
                kind = K_INT;
                p = q + 1;
            } else if (q < e && *q == 'u' && !neg) {
                if (parse_mag(ds, q, UINT64_MAX, &num.u) < 0) return BAD;
                kind = K_UINT;
                p = q + 1;
            } else {
                if (q + 1 < e && *q == '.' && IS_DIGIT(q[1])) {
                    for (q++; q < e && IS_DIGIT(*q);) q++;
                }
                if (q < e && (*q == 'e' || *q == 'E')) {
                    const char *x2 = q + 1;
                    if (x2 < e && (*x2 == '+' || *x2 == '-')) x2++;
                    if (x2 < e && IS_DIGIT(*x2)) {
                        while (x2 < e && IS_DIGIT(*x2)) x2++;
                        q = x2;
                    }
                }
                kind = K_FLOAT;
                if (!fast_float(tok, q, &num.f)) {
                    pending = 1;
                    num.f = 0.0;
                }
                p = q;
            }
        } else if (c0 == '"') {
            const char *cs = p + 1;
            const char *q = memchr(cs, '"', (size_t)(e - cs));
            if (q == NULL) return BAD;
            const char *bs = memchr(cs, '\\', (size_t)(q - cs));
            if (bs == NULL) {
                v = cs;
                vl = (size_t)(q - cs);
            } else { /* only \" and \\ are escapes */
                char *w = x->sval.p;
                memcpy(w, cs, (size_t)(bs - cs));
                w += bs - cs;
                for (q = bs;;) {
                    if (q >= e) return BAD;
                    if (*q == '"') break;
                    if (*q == '\\') {
                        if (q + 1 < e && (q[1] == '"' || q[1] == '\\')) {
                            *w++ = q[1];
                            q += 2;
                        } else {
                            *w++ = *q++;
                        }
                        continue;
                    }
                    *w++ = *q++;
                }
                v = x->sval.p;
                vl = (size_t)(w - x->sval.p);
            }
            if (vl > MAX_NAME) return BAD;
            kind = K_STR;
            p = q + 1;
        } else if (c0 == 't' || c0 == 'T' || c0 == 'f' || c0 == 'F') {
            size_t rest = (size_t)(e - p);
            kind = K_BOOL;
            bval = c0 == 't' || c0 == 'T';
            if (c0 == 't' && rest >= 4 && memcmp(p, "true", 4) == 0) p += 4;
            else if (c0 == 'T' && rest >= 4 && (memcmp(p, "True", 4) == 0 || memcmp(p, "TRUE", 4) == 0)) p += 4;
            else if (c0 == 'f' && rest >= 5 && memcmp(p, "false", 5) == 0) p += 5;
            else if (c0 == 'F' && rest >= 5 && (memcmp(p, "False", 5) == 0 || memcmp(p, "FALSE", 5) == 0)) p += 5;
            else p += 1;
        } else {
            return BAD;
        }
        if (p < e && *p != ',' && *p != ' ') return BAD;

        int32_t ci = get_col(t, k, kl, kind, i < NGUESS ? &t->field_guess[i] : NULL);
        if (ci < 0) return ci;
        Col *c = &t->cols[ci];
        int again = c->n > row; /* the field repeated in the line with the same type: the last wins */
        switch (kind) {
        case K_STR:
            r = col_set_str(c, row, v, vl, again);
            break;
        case K_BOOL:
            r = col_set_bool(c, row, bval, again);
            break;
        default:
            r = col_set_8(c, row, &num, again);
        }
        if (r < 0) return r;
        if (kind == K_FLOAT) {
            if (again) {
                for (size_t j = x->npend; j-- > 0 && x->pend[j].table == ti && x->pend[j].row == row;) {
                    if (x->pend[j].col == ci) x->pend[j].len = 0;
                }
            }
            if (pending) {
                if (x->npend == x->cappend) {
                    size_t nc = x->cappend ? x->cappend * 2 : 64;
                    if (nc > SIZE_MAX / sizeof(Pending)) return NOMEM;
                    Pending *np = realloc(x->pend, nc * sizeof(Pending));
                    if (np == NULL) return NOMEM;
                    x->pend = np;
                    x->cappend = nc;
                }
                Pending *pe = &x->pend[x->npend++];
                pe->table = ti;
                pe->col = ci;
                pe->row = row;
                pe->p = tok;
                pe->len = (size_t)(p - tok);
            }
        }
        if (p < e && *p == ',') {
            p++;
            continue;
        }
        break;
    }

    int64_t ts = x->deftime;
    if (p < e) { /* *p == ' ' */
        while (p < e && *p == ' ') p++;
        if (p >= e) return BAD; /* trailing spaces without a timestamp */
        int neg = 0;
        if (*p == '-') {
            neg = 1;
            p++;
        }
        const char *ds = p;
        p = digits_end(p, e, lim);
        if (p == ds) return BAD;
        uint64_t mag;
        if (parse_mag(ds, p, neg ? (1ULL << 63) : (1ULL << 63) - 1, &mag) < 0) return BAD;
        while (p < e && *p == ' ') p++;
        if (p < e) return BAD;
        int64_t v0 = neg ? (int64_t)(0 - mag) : (int64_t)mag;
        if (__builtin_mul_overflow(v0, x->mult, &ts)) return BAD;
    }
    if (buf_reserve(&t->time, (size_t)(row + 1) * 8, 0) < 0) return NOMEM;
    memcpy(t->time.p + (size_t)row * 8, &ts, 8);
    t->time.len = (size_t)(row + 1) * 8;
    t->nrows = row + 1;
    return OK;
}

/* --------------------------------------------------------------------------------------------
 * the body: UTF-8, line splitting (IOx split_lines), trimming
 * ------------------------------------------------------------------------------------------ */

/* strict UTF-8, as Python's decoder (no surrogates, no overlongs, <= U+10FFFF) */
static int utf8_valid(const unsigned char *s, size_t n) {
    const uint64_t hi = 0x8080808080808080ULL;
    size_t i = 0;
    while (i < n) {
        for (; i + 32 <= n; i += 32) { /* ASCII runs */
            uint64_t a, b, c, d;
            memcpy(&a, s + i, 8);
            memcpy(&b, s + i + 8, 8);
            memcpy(&c, s + i + 16, 8);
            memcpy(&d, s + i + 24, 8);
            if ((a | b | c | d) & hi) break;
        }
        for (; i + 8 <= n; i += 8) {
            uint64_t a;
            memcpy(&a, s + i, 8);
            if (a & hi) break;
        }
        if (i >= n) break;
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned char lo = 0x80, top = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) top = 0x9F; /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) top = 0x8F; /* <= U+10FFFF */
        } else {
            return 0;
        }
        if (n - i - 1 < need) return 0;
        if (s[i + 1] < lo || s[i + 1] > top) return 0;
        for (size_t j = 2; j <= need; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        }
        i += need + 1;
    }
    return 1;
}

/* end of the logical line starting at `pos` (the '\n' ending it, or n): IOx split_lines, as
 * line_protocol._split_state: a newline inside a quoted field value, or after a backslash,
 * does not end the line.  A backslash escapes the next byte; a space starts the "fields" part,
 * where a quote toggles `quoted` while more '=' than ',' were seen outside quotes. */
static Py_ssize_t logical_end(const char *s, Py_ssize_t pos, Py_ssize_t n) {
    int quoted = 0, fields = 0;
    int64_t equals = 0, commas = 0;
    Py_ssize_t p = pos, skip_to = pos; /* bytes before skip_to were escaped */
#define SPLIT_STEP(q)                                      \
    switch (s[q]) {                                        \
    case '\n':                                             \
        if (!quoted) return (q);                           \
        break;                                             \
    case '\\':                                             \
        skip_to = (q) + 2;                                 \
        break;                                             \
    case ' ':                                              \
        fields = 1;                                        \
        break;                                             \
    case '"':                                              \
        if (fields && equals > commas) quoted = !quoted;   \
        break;                                             \
    case '=':                                              \
        if (fields && !quoted) equals++;                   \
        break;                                             \
    case ',':                                              \
        if (fields && !quoted) commas++;                   \
        break;                                             \
    }
#ifdef __SSE2__
    const __m128i cn = _mm_set1_epi8('\n'), cb = _mm_set1_epi8('\\'), cs = _mm_set1_epi8(' '),
                  cq = _mm_set1_epi8('"'), ce = _mm_set1_epi8('='), cc = _mm_set1_epi8(',');
    for (; n - p >= 16; p += 16) { /* only the token bytes of each 16 */
        __m128i x = _mm_loadu_si128((const __m128i *)(s + p));
        __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, cn), _mm_cmpeq_epi8(x, cb)),
                                 _mm_or_si128(_mm_cmpeq_epi8(x, cs), _mm_cmpeq_epi8(x, cq)));
        m = _mm_or_si128(m, _mm_or_si128(_mm_cmpeq_epi8(x, ce), _mm_cmpeq_epi8(x, cc)));
        for (unsigned mask = (unsigned)_mm_movemask_epi8(m); mask; mask &= mask - 1) {
            Py_ssize_t q = p + __builtin_ctz(mask);
            if (q < skip_to) continue;
            SPLIT_STEP(q)
        }
    }
#endif
    for (p = p > skip_to ? p : skip_to; p < n; p = p > skip_to ? p : skip_to) {
        if (SPLIT_TOKEN[(unsigned char)s[p]]) {
            SPLIT_STEP(p)
        }
        p++;
    }
#undef SPLIT_STEP
    return n;
}

static Py_ssize_t find_byte(const char *s, Py_ssize_t pos, Py_ssize_t n, char c) {
    const char *q = memchr(s + pos, c, (size_t)(n - pos));
    return q ? q - s : n;
}

/* the whole body; OK when every line is good */
static int parse_body(Ctx *x) {
    const char *s = x->body;
    Py_ssize_t n = x->n, pos = 0;
    Py_ssize_t nq = -1, nb = -1; /* next '"' / '\\' at or after pos (n: none), recomputed when passed */
    int special = n > 0 && (memchr(s, '"', (size_t)n) != NULL || memchr(s, '\\', (size_t)n) != NULL);
    while (pos < n) {
        Py_ssize_t le = find_byte(s, pos, n, '\n');
        if (special) {
            if (nq < pos) nq = find_byte(s, pos, n, '"');
            if (nb < pos) nb = find_byte(s, pos, n, '\\');
            if (nq < le || nb < le) le = logical_end(s, pos, n);
        }
        Py_ssize_t e = le;
        if (e > pos && s[e - 1] == '\r') e--;
        /* _trim_leading: spaces, tabs, newlines and whole comments */
        const char *p = s + pos, *pe = s + e;
        for (;;) {
            while (p < pe && (*p == ' ' || *p == '\t' || *p == '\n')) p++;
            if (p < pe && *p == '#') {
                const char *q = memchr(p, '\n', (size_t)(pe - p));
                p = q ? q : pe;
                continue;
            }
            break;
        }
        if (p < pe) {
            int r = parse_line(x, p, pe);
            if (r < 0) return r;
        }
        pos = le + 1;
    }
    return OK;
}

/* pads every column to the table's rows; sets unique_keys (a hash set of (tag set, time)) */
static int finish_tables(Ctx *x) {
    for (int32_t ti = 0; ti < x->ntables; ti++) {
        Table *t = &x->tables[ti];
        int64_t n = t->nrows;
        for (int32_t ci = 0; ci < t->ncols; ci++) {
            Col *c = &t->cols[ci];
            if (col_pad(c, n) < 0) return NOMEM;
            if (c->kind == K_BOOL && bits_ensure(&c->val, n) < 0) return NOMEM;
            if (c->has_valid && bits_ensure(&c->valid, n) < 0) return NOMEM;
        }
        /* unique_keys: no two rows with the same (tag set, time) */
        int32_t *tags = malloc(sizeof(int32_t) * (size_t)(t->ncols ? t->ncols : 1));
        if (tags == NULL) return NOMEM;
        int32_t ntags = 0;
        for (int32_t ci = 0; ci < t->ncols; ci++) {
            if (t->cols[ci].kind == K_TAG) tags[ntags++] = ci;
        }
        if (n >= INT32_MAX) { /* (row + 1 in 32-bit slots) not here: Python's business */
            free(tags);
            return BAD;
        }
        size_t cap = 16;
        while (cap < (size_t)n * 2) cap *= 2;
        uint32_t *slot = calloc(cap, sizeof(uint32_t)); /* row + 1, 0: empty */
        uint64_t *rh = malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
        if (slot == NULL || rh == NULL) {
            free(tags);
            free(slot);
            free(rh);
            return NOMEM;
        }
        const int64_t *time = (const int64_t *)t->time.p;
        int unique = 1;
        for (int64_t r = 0; r < n && unique; r++) {
            uint64_t h = mix64((uint64_t)time[r] ^ 0x9e3779b97f4a7c15ULL);
            for (int32_t j = 0; j < ntags; j++) {
                const Col *c = &t->cols[tags[j]];
                if (c->has_valid && !bit_get(&c->valid, r)) continue;
                const int32_t *off = (const int32_t *)c->off.p;
                uint64_t hv = hash_bytes(c->val.p + off[r], (size_t)(off[r + 1] - off[r]));
                h = mix64(h ^ (hv + 0x9e3779b97f4a7c15ULL * (uint64_t)(j + 1)));
            }
            rh[r] = h;
            size_t mask = cap - 1;
            size_t i;
            for (i = (size_t)h & mask; slot[i]; i = (i + 1) & mask) {
                int64_t o = (int64_t)slot[i] - 1;
                if (rh[o] != h || time[o] != time[r]) continue;
                int same = 1;
                for (int32_t j = 0; j < ntags && same; j++) {
                    const Col *c = &t->cols[tags[j]];
                    int va = !c->has_valid || bit_get(&c->valid, r);
                    int vb = !c->has_valid || bit_get(&c->valid, o);
                    if (va != vb) same = 0;
                    else if (va) {
                        const int32_t *off = (const int32_t *)c->off.p;
                        int32_t la = off[r + 1] - off[r], lb = off[o + 1] - off[o];
                        same = la == lb && memcmp(c->val.p + off[r], c->val.p + off[o], (size_t)la) == 0;
                    }
                }
                if (same) {
                    unique = 0;
                    break;
                }
            }
            slot[i] = (uint32_t)(r + 1);
        }
        t->unique = unique;
        free(tags);
        free(slot);
        free(rh);
    }
    return OK;
}

/* --------------------------------------------------------------------------------------------
 * Buffer: read-only bytes owning a malloc'd block (Arrow takes it without a copy)
 * ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
} BufferObject;

static char EMPTY[8];

static int Buffer_getbuffer(BufferObject *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? self->data : EMPTY, self->len, 1, flags);
}

static void Buffer_dealloc(BufferObject *self) {
    free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t Buffer_len(BufferObject *self) { return self->len; }

static PyBufferProcs Buffer_as_buffer = {(getbufferproc)Buffer_getbuffer, NULL};
static PySequenceMethods Buffer_as_sequence = {.sq_length = (lenfunc)Buffer_len};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "server.write._lpfast.Buffer",
    .tp_doc = "Read-only bytes of one Arrow buffer (owns its memory).",
    .tp_basicsize = sizeof(BufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_as_sequence = &Buffer_as_sequence,
};

/* a Buffer taking b's first `len` bytes (b is emptied) */
static PyObject *take_buffer(Buf *b, size_t len) {
    BufferObject *o = PyObject_New(BufferObject, &BufferType);
    if (o == NULL) return NULL;
    o->data = b->p;
    o->len = (Py_ssize_t)len;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

/* --------------------------------------------------------------------------------------------
 * the Python result
 * ------------------------------------------------------------------------------------------ */

static int cmp_cols(const void *a, const void *b) {
    const Col *x = *(const Col *const *)a, *y = *(const Col *const *)b;
    int rx = x->kind != K_TAG, ry = y->kind != K_TAG;
    if (rx != ry) return rx - ry;
    size_t m = x->name.len < y->name.len ? x->name.len : y->name.len;
    int c = memcmp(x->name.p, y->name.p, m);
    if (c) return c;
    return (x->name.len > y->name.len) - (x->name.len < y->name.len);
}

static PyObject *column_tuple(Col *c, int64_t n) {
    PyObject *name = NULL, *vals = NULL, *offs = NULL, *valid = NULL;
    name = PyUnicode_DecodeUTF8(c->name.p, (Py_ssize_t)c->name.len, "strict");
    if (name == NULL) goto fail;
    size_t vlen;
    if (c->kind == K_TAG || c->kind == K_STR) vlen = (size_t)((int32_t *)c->off.p)[n];
    else if (c->kind == K_BOOL) vlen = (size_t)((n + 7) / 8);
    else vlen = (size_t)n * 8;
    vals = take_buffer(&c->val, vlen);
    if (vals == NULL) goto fail;
    if (c->kind == K_TAG || c->kind == K_STR) {
        offs = take_buffer(&c->off, (size_t)(n + 1) * 4);
        if (offs == NULL) goto fail;
    } else {
        offs = Py_NewRef(Py_None);
    }
    if (c->has_valid && c->nulls > 0) {
        valid = take_buffer(&c->valid, (size_t)((n + 7) / 8));
        if (valid == NULL) goto fail;
    } else {
        valid = Py_NewRef(Py_None);
    }
    return Py_BuildValue("(NiNNNL)", name, c->kind, vals, offs, valid, (long long)c->nulls);
fail:
    Py_XDECREF(name);
    Py_XDECREF(vals);
    Py_XDECREF(offs);
    Py_XDECREF(valid);
    return NULL;
}

static PyObject *build_result(Ctx *x) {
    PyObject *out = PyList_New(x->ntables);
    if (out == NULL) return NULL;
    for (int32_t ti = 0; ti < x->ntables; ti++) {
        Table *t = &x->tables[ti];
        Col **order = malloc(sizeof(Col *) * (size_t)(t->ncols ? t->ncols : 1));
        if (order == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (int32_t ci = 0; ci < t->ncols; ci++) order[ci] = &t->cols[ci];
        qsort(order, (size_t)t->ncols, sizeof(Col *), cmp_cols);
        PyObject *cols = PyList_New(t->ncols);
        if (cols == NULL) {
            free(order);
            goto fail;
        }
        for (int32_t ci = 0; ci < t->ncols; ci++) {
            PyObject *ct = column_tuple(order[ci], t->nrows);
            if (ct == NULL) {
                free(order);
                Py_DECREF(cols);
                goto fail;
            }
            PyList_SET_ITEM(cols, ci, ct);
        }
        free(order);
        PyObject *name = PyUnicode_DecodeUTF8(t->name.p, (Py_ssize_t)t->name.len, "strict");
        PyObject *time = name ? take_buffer(&t->time, (size_t)t->nrows * 8) : NULL;
        if (time == NULL) {
            Py_XDECREF(name);
            Py_DECREF(cols);
            goto fail;
        }
        PyObject *tt = Py_BuildValue("(NLONN)", name, (long long)t->nrows, t->unique ? Py_True : Py_False, cols, time);
        if (tt == NULL) goto fail;
        PyList_SET_ITEM(out, ti, tt);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* converts the floats left to Python's own conversion; OK or BAD */
static int resolve_pending(Ctx *x) {
    char small[128];
    for (size_t j = 0; j < x->npend; j++) {
        Pending *pe = &x->pend[j];
        if (pe->len == 0) continue;
        char *buf = pe->len < sizeof(small) ? small : malloc(pe->len + 1);
        if (buf == NULL) return BAD;
        memcpy(buf, pe->p, pe->len);
        buf[pe->len] = 0;
        char *end = NULL;
        double v = PyOS_string_to_double(buf, &end, NULL);
        int ok = !(v == -1.0 && PyErr_Occurred()) && end == buf + pe->len;
        if (buf != small) free(buf);
        if (!ok) {
            PyErr_Clear();
            return BAD;
        }
        Col *c = &x->tables[pe->table].cols[pe->col];
        memcpy(c->val.p + (size_t)pe->row * 8, &v, 8);
    }
    return OK;
}

PyDoc_STRVAR(parse_doc,
"parse(body: bytes | str, mult: int, default_time: int) -> list | None\n\n"
"Parse a whole line protocol request (timestamps times `mult`, `default_time` for lines without\n"
"one). None when any line is bad or not handled here (the caller falls back to the Python\n"
"parser); otherwise [(table, rows, unique_keys, [(column, kind, values, offsets, validity,\n"
"null_count)], time)], see the module source.");

static PyObject *lp_parse(PyObject *self, PyObject *args) {
    PyObject *body;
    long long mult, deftime;
    (void)self;
    if (!PyArg_ParseTuple(args, "OLL:parse", &body, &mult, &deftime)) return NULL;
    Ctx x;
    memset(&x, 0, sizeof(x));
    x.last_table = -1;
    x.mult = mult;
    x.deftime = deftime;
    int check_utf8;
    if (PyBytes_Check(body)) {
        x.body = PyBytes_AS_STRING(body);
        x.n = PyBytes_GET_SIZE(body);
        check_utf8 = 1;
    } else if (PyUnicode_Check(body)) {
        x.body = PyUnicode_AsUTF8AndSize(body, &x.n);
        if (x.body == NULL) { /* lone surrogates */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        check_utf8 = 0;
    } else {
        PyErr_SetString(PyExc_TypeError, "body must be bytes or str");
        return NULL;
    }
    Py_INCREF(body); /* the scan reads it without the GIL */
    int r = OK;
    Py_BEGIN_ALLOW_THREADS
    if (check_utf8 && !utf8_valid((const unsigned char *)x.body, (size_t)x.n)) r = BAD;
    if (r == OK) r = parse_body(&x);
    if (r == OK) r = finish_tables(&x);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (r == OK) r = resolve_pending(&x);
    if (r == OK) {
        out = build_result(&x);
        if (out == NULL && PyErr_ExceptionMatches(PyExc_MemoryError)) {
            PyErr_Clear();
            out = Py_NewRef(Py_None);
        }
    } else {
        out = Py_NewRef(Py_None);
    }
    ctx_free(&x);
    Py_DECREF(body);
    return out;
}

static PyMethodDef lp_methods[] = {
    {"parse", lp_parse, METH_VARARGS, parse_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef lp_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "server.write._lpfast",
    .m_doc = "The C first attempt of server.write.line_protocol.parse_lines (see the source's header).",
    .m_size = -1,
    .m_methods = lp_methods,
};

PyMODINIT_FUNC PyInit__lpfast(void) {
    if (PyType_Ready(&BufferType) < 0) return NULL;
    PyObject *m = PyModule_Create(&lp_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Buffer", (PyObject *)&BufferType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
