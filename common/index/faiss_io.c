/*
 * faiss_io — Faiss IwPQ / IwQR reader and writer (layout: SPEC §1, seed 002).
 *
 * Reading is two passes over a file that is already wholly in memory:
 *   1. parse: walk the bytes with a bounds-checked cursor, validate every field and
 *      count, and remember where each payload (centroids, codes, ids, ...) lies. Nothing
 *      large is allocated here, so a hostile header cannot make us allocate; the only
 *      allocations are the per-list size table (8 bytes per list, each list being backed
 *      by at least 4*d centroid bytes of the file) and a key copy for the hashtable
 *      duplicate check (backed by >= 9 file bytes per entry).
 *   2. build: create the tsr_ivfpq and copy the payloads; every size is now proven to be
 *      present in the file, so allocations are bounded by the file length.
 *
 * The reader is strict where Faiss is deterministic (dummy fields = 1<<20, sprs pairs
 * strictly increasing and non-empty, quantizer fourcc agreeing with its metric, no bytes
 * after the index), so that any file it accepts is rewritten byte for byte, except a
 * "full"/"sprs" choice that differs from Faiss's rule (recorded in ix->list_type).
 */
#include "index/faiss_io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/mem.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "faiss_io copies raw little-endian fields; a big-endian host needs byte swapping"
#endif

#define FAISS_DUMMY ((int64_t)1 << 20)

static uint32_t fourcc(const char *s)
{
    return (uint32_t)(uint8_t)s[0] | (uint32_t)(uint8_t)s[1] << 8 |
           (uint32_t)(uint8_t)s[2] << 16 | (uint32_t)(uint8_t)s[3] << 24;
}

/* "\"IwPQ\"" when printable, else the hex value; out has room for 16 bytes. */
static const char *fourcc_str(uint32_t h, char out[16])
{
    char c[4];
    int printable = 1;
    for (int i = 0; i < 4; i++) {
        c[i] = (char)(h >> (8 * i));
        if (c[i] < 0x20 || c[i] > 0x7e)
            printable = 0;
    }
    if (printable)
        snprintf(out, 16, "\"%c%c%c%c\"", c[0], c[1], c[2], c[3]);
    else
        snprintf(out, 16, "0x%08" PRIx32, h);
    return out;
}

/* ---- bounds-checked cursor ------------------------------------------------------------ */

typedef struct {
    const uint8_t *buf;
    size_t len;
    size_t off;
    tsr_error *err;
} cursor;

static size_t remain(const cursor *c) { return c->len - c->off; }

static int rd(cursor *c, void *dst, size_t n, const char *field)
{
    if (remain(c) < n)
        return tsr_err(c->err, TSR_EFORMAT, "offset %zu: %s: needs %zu bytes but only %zu remain",
                       c->off, field, n, remain(c));
    memcpy(dst, c->buf + c->off, n);
    c->off += n;
    return 0;
}

/* Formats n*elem bytes without overflowing. */
static const char *bytes_str(uint64_t n, size_t elem, char out[32])
{
    if (elem != 0 && n > UINT64_MAX / elem)
        snprintf(out, 32, "more than 2^64");
    else
        snprintf(out, 32, "%" PRIu64, n * (uint64_t)elem);
    return out;
}

static int rd_bool(cursor *c, int *out, const char *field)
{
    size_t at = c->off;
    uint8_t b = 0;
    if (rd(c, &b, 1, field) != 0)
        return c->err ? c->err->code : TSR_EFORMAT;
    if (b > 1)
        return tsr_err(c->err, TSR_EFORMAT, "offset %zu: %s: bool byte is %u, expected 0 or 1", at,
                       field, b);
    *out = b;
    return 0;
}

/* vector<T>: u64 count then the elements. Returns the count and a pointer into the file,
 * after checking the elements are present (count*elem <= remaining, overflow-safe). */
static int rd_vec(cursor *c, size_t elem, const char *field, const char *what, size_t *n_out,
                  size_t *data_off)
{
    size_t at = c->off;
    uint64_t n;
    int rc = rd(c, &n, 8, field);
    if (rc != 0)
        return rc;
    if (n > remain(c) / elem) {
        char b[32];
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: %s: vector of %" PRIu64 " %s needs %s bytes but only %zu remain",
                       at, field, n, what, bytes_str(n, elem, b), remain(c));
    }
    *n_out = (size_t)n;
    *data_off = c->off;
    c->off += (size_t)n * elem;
    return 0;
}

#define RD(c, var, field)                                  \
    do {                                                   \
        int rc_ = rd((c), &(var), sizeof(var), (field));   \
        if (rc_ != 0)                                      \
            return rc_;                                    \
    } while (0)

/* ---- parse (pass 1) ------------------------------------------------------------------- */

typedef struct {
    int32_t d;
    int64_t ntotal;
    int is_trained;
    int32_t metric;
    size_t d_off, ntotal_off, metric_off;
} index_header;

typedef struct {
    uint64_t d, M, nbits;
    size_t code_size;
    size_t cent_off; /* d * 2^nbits floats */
} pq_header;

typedef struct {
    uint32_t top;
    index_header ih;
    uint64_t nlist, nprobe;
    uint32_t qfourcc;
    index_header qh;
    size_t cent_off;
    uint8_t dm_type;
    size_t dm_arr_n, dm_arr_off, dm_hash_n, dm_hash_off;
    int by_residual;
    uint64_t code_size;
    pq_header pq;
    uint32_t list_type;
    uint64_t *sizes; /* owned: nlist list sizes */
    size_t data_off; /* codes and ids of the non-empty lists, in list order */
    pq_header rpq;
    size_t rcodes_n, rcodes_off;
    float k_factor;
} parsed;

static int rd_index_header(cursor *c, const char *who, index_header *h)
{
    char f[64];
    int64_t dummy;
    snprintf(f, sizeof f, "%s.d", who);
    h->d_off = c->off;
    RD(c, h->d, f);
    if (h->d <= 0)
        return tsr_err(c->err, TSR_EFORMAT, "offset %zu: %s: dimension %" PRId32 ", expected > 0",
                       h->d_off, f, h->d);
    snprintf(f, sizeof f, "%s.ntotal", who);
    h->ntotal_off = c->off;
    RD(c, h->ntotal, f);
    if (h->ntotal < 0)
        return tsr_err(c->err, TSR_EFORMAT, "offset %zu: %s: %" PRId64 ", expected >= 0",
                       h->ntotal_off, f, h->ntotal);
    for (int i = 0; i < 2; i++) {
        size_t at = c->off;
        snprintf(f, sizeof f, "%s.dummy%d", who, i + 1);
        RD(c, dummy, f);
        if (dummy != FAISS_DUMMY)
            return tsr_err(c->err, TSR_EFORMAT,
                           "offset %zu: %s: %" PRId64 ", expected 1048576 (Faiss writes 1<<20)",
                           at, f, dummy);
    }
    snprintf(f, sizeof f, "%s.is_trained", who);
    int rc = rd_bool(c, &h->is_trained, f);
    if (rc != 0)
        return rc;
    snprintf(f, sizeof f, "%s.metric_type", who);
    h->metric_off = c->off;
    RD(c, h->metric, f);
    if (h->metric > 1) {
        float arg;
        char fa[64];
        snprintf(fa, sizeof fa, "%s.metric_arg", who);
        RD(c, arg, fa);
    }
    if (h->metric != 0 && h->metric != 1)
        return tsr_err(c->err, TSR_EUNSUPPORTED,
                       "offset %zu: %s: metric %" PRId32 " is not supported, expected 0 "
                       "(METRIC_INNER_PRODUCT) or 1 (METRIC_L2)",
                       h->metric_off, f, h->metric);
    return 0;
}

static int rd_pq(cursor *c, const char *who, int32_t index_d, const char *index_field,
                 pq_header *pq)
{
    char f[64];
    size_t at = c->off;
    snprintf(f, sizeof f, "%s.d", who);
    RD(c, pq->d, f);
    if (pq->d != (uint64_t)index_d)
        return tsr_err(c->err, TSR_EFORMAT, "offset %zu: %s: %" PRIu64 ", expected %s = %" PRId32,
                       at, f, pq->d, index_field, index_d);
    at = c->off;
    snprintf(f, sizeof f, "%s.M", who);
    RD(c, pq->M, f);
    if (pq->M == 0 || pq->d % pq->M != 0)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: %s: %" PRIu64 ", expected a divisor of d = %" PRIu64, at, f,
                       pq->M, pq->d);
    at = c->off;
    snprintf(f, sizeof f, "%s.nbits", who);
    RD(c, pq->nbits, f);
    if (pq->nbits < 1 || pq->nbits > 16)
        return tsr_err(c->err, TSR_EFORMAT, "offset %zu: %s: %" PRIu64 ", expected 1..16", at, f,
                       pq->nbits);
    pq->code_size = (size_t)((pq->M * pq->nbits + 7) / 8);
    at = c->off;
    snprintf(f, sizeof f, "%s.centroids", who);
    size_t n;
    int rc = rd_vec(c, sizeof(float), f, "floats", &n, &pq->cent_off);
    if (rc != 0)
        return rc;
    uint64_t want = pq->d << pq->nbits; /* d < 2^31, nbits <= 16: no overflow */
    if (n != want)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: %s: %zu floats, expected d * 2^nbits = %" PRIu64, at, f, n, want);
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t i64_at(const cursor *c, size_t off)
{
    int64_t v;
    memcpy(&v, c->buf + off, 8);
    return v;
}

/* A direct-map entry is Faiss's lo_build(list_no, offset) = list_no << 32 | offset. */
static int check_dm_entry(cursor *c, const parsed *p, size_t off, const char *field, size_t i,
                          int allow_missing)
{
    int64_t v = i64_at(c, off);
    if (v == -1 && allow_missing)
        return 0;
    uint64_t list = (uint64_t)v >> 32, ofs = (uint64_t)v & 0xffffffffu;
    if (v < 0 || list >= p->nlist || ofs >= p->sizes[list])
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: %s[%zu]: %" PRId64 " (list %" PRIu64 ", offset %" PRIu64
                       "), expected a (list_no << 32 | offset) inside the inverted lists",
                       off, field, i, v, list, ofs);
    return 0;
}

static int check_direct_map(cursor *c, parsed *p)
{
    for (size_t i = 0; i < p->dm_arr_n; i++) {
        int rc = check_dm_entry(c, p, p->dm_arr_off + 8 * i, "direct_map.array", i, 1);
        if (rc != 0)
            return rc;
    }
    if (p->dm_hash_n == 0)
        return 0;
    for (size_t i = 0; i < p->dm_hash_n; i++) {
        int rc = check_dm_entry(c, p, p->dm_hash_off + 16 * i + 8, "direct_map.hashtable.value",
                                i, 0);
        if (rc != 0)
            return rc;
    }
    /* Faiss stores an unordered_map: keys are unique. A duplicate would be collapsed on load. */
    int64_t *keys = tsr_try_malloc(p->dm_hash_n, sizeof(int64_t));
    if (keys == NULL)
        return tsr_err(c->err, TSR_ENOMEM, "out of memory for %zu hashtable keys", p->dm_hash_n);
    for (size_t i = 0; i < p->dm_hash_n; i++)
        keys[i] = i64_at(c, p->dm_hash_off + 16 * i);
    qsort(keys, p->dm_hash_n, sizeof(int64_t), cmp_i64);
    int rc = 0;
    for (size_t i = 1; i < p->dm_hash_n; i++) {
        if (keys[i] == keys[i - 1]) {
            size_t first = 0;
            while (i64_at(c, p->dm_hash_off + 16 * first) != keys[i])
                first++;
            rc = tsr_err(c->err, TSR_EFORMAT,
                         "offset %zu: direct_map.hashtable: key %" PRId64
                         " appears more than once, expected unique ids",
                         p->dm_hash_off + 16 * first, keys[i]);
            break;
        }
    }
    free(keys);
    return rc;
}

static int rd_invlists(cursor *c, parsed *p)
{
    char b[32], f[64];
    size_t at = c->off;
    uint32_t h;
    RD(c, h, "invlists.fourcc");
    if (h != fourcc("ilar")) {
        char s[16];
        return tsr_err(c->err, h == fourcc("il00") || h == fourcc("ilod") ? TSR_EUNSUPPORTED
                                                                            : TSR_EFORMAT,
                       "offset %zu: invlists.fourcc: %s is not supported, expected \"ilar\" "
                       "(ArrayInvertedLists)",
                       at, fourcc_str(h, s));
    }
    uint64_t nlist, cs;
    at = c->off;
    RD(c, nlist, "invlists.nlist");
    if (nlist != p->nlist)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: invlists.nlist: %" PRIu64 ", expected nlist = %" PRIu64, at,
                       nlist, p->nlist);
    at = c->off;
    RD(c, cs, "invlists.code_size");
    if (cs != p->code_size)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: invlists.code_size: %" PRIu64 ", expected code_size = %" PRIu64,
                       at, cs, p->code_size);
    at = c->off;
    RD(c, p->list_type, "invlists.list_type");
    int full = p->list_type == fourcc("full");
    if (!full && p->list_type != fourcc("sprs")) {
        char s[16];
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: invlists.list_type: %s, expected \"full\" or \"sprs\"", at,
                       fourcc_str(p->list_type, s));
    }
    at = c->off;
    size_t n, vec_off;
    int rc = rd_vec(c, 8, full ? "invlists.sizes" : "invlists.sparse_sizes", "u64", &n, &vec_off);
    if (rc != 0)
        return rc;
    if (full && n != p->nlist)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: invlists.sizes: %zu entries, expected nlist = %" PRIu64, at, n,
                       p->nlist);
    if (!full && n % 2 != 0)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: invlists.sparse_sizes: %zu entries, expected an even count "
                       "of (list_no, size) pairs",
                       at, n);
    /* nlist is backed by nlist*d*4 centroid bytes already read, so this is bounded. */
    p->sizes = tsr_try_calloc((size_t)p->nlist, sizeof(uint64_t));
    if (p->sizes == NULL)
        return tsr_err(c->err, TSR_ENOMEM, "out of memory for %" PRIu64 " list sizes", p->nlist);
    /* Bytes left for list payloads; each size is checked against it as it is read. */
    size_t left = remain(c), per = (size_t)p->code_size + sizeof(int64_t);
    uint64_t sum = 0, prev = 0;
    for (size_t j = 0; j < n; j += full ? 1 : 2) {
        size_t eoff = vec_off + 8 * j;
        uint64_t list = j, size;
        if (!full) {
            memcpy(&list, c->buf + eoff, 8);
            if (list >= p->nlist)
                return tsr_err(c->err, TSR_EFORMAT,
                               "offset %zu: invlists.sparse_sizes[%zu]: list_no %" PRIu64
                               ", expected < nlist = %" PRIu64,
                               eoff, j, list, p->nlist);
            if (j > 0 && list <= prev)
                return tsr_err(c->err, TSR_EFORMAT,
                               "offset %zu: invlists.sparse_sizes[%zu]: list_no %" PRIu64
                               " after %" PRIu64 ", expected strictly increasing list numbers",
                               eoff, j, list, prev);
            prev = list;
            eoff += 8;
        }
        memcpy(&size, c->buf + eoff, 8);
        snprintf(f, sizeof f, full ? "invlists.sizes[%zu]" : "invlists.sparse_sizes[%zu]",
                 full ? j : j + 1);
        if (!full && size == 0)
            return tsr_err(c->err, TSR_EFORMAT,
                           "offset %zu: %s: size 0 for list %" PRIu64
                           ", expected only non-empty lists in a sparse table",
                           eoff, f, list);
        if (size > left / per)
            return tsr_err(c->err, TSR_EFORMAT,
                           "offset %zu: %s: list size %" PRIu64 " needs %s bytes but only %zu remain",
                           eoff, f, size, bytes_str(size, per, b), left);
        left -= (size_t)size * per;
        sum += size;
        p->sizes[list] = size;
    }
    if (sum != (uint64_t)p->ih.ntotal)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: invlists.sizes: list sizes sum to %" PRIu64
                       ", expected ntotal = %" PRId64,
                       at, sum, p->ih.ntotal);
    p->data_off = c->off;
    c->off = c->len - left;
    return 0;
}

static int parse(cursor *c, parsed *p)
{
    char s[16];
    int rc;
    size_t at = 0;
    RD(c, p->top, "fourcc");
    if (p->top != fourcc("IwPQ") && p->top != fourcc("IwQR")) {
        int legacy = p->top == fourcc("IvPQ") || p->top == fourcc("IvQR");
        return tsr_err(c->err, legacy ? TSR_EUNSUPPORTED : TSR_EFORMAT,
                       "offset %zu: fourcc: %s is not supported, expected \"IwPQ\" (IndexIVFPQ) "
                       "or \"IwQR\" (IndexIVFPQR)%s",
                       at, fourcc_str(p->top, s), legacy ? " (legacy IvPQ/IvQR format)" : "");
    }
    if ((rc = rd_index_header(c, "index", &p->ih)) != 0)
        return rc;
    at = c->off;
    RD(c, p->nlist, "ivf.nlist");
    if (p->nlist == 0)
        return tsr_err(c->err, TSR_EFORMAT, "offset %zu: ivf.nlist: 0, expected >= 1", at);
    RD(c, p->nprobe, "ivf.nprobe");

    at = c->off;
    RD(c, p->qfourcc, "quantizer.fourcc");
    if (p->qfourcc != fourcc("IxF2") && p->qfourcc != fourcc("IxFI"))
        return tsr_err(c->err, p->qfourcc == fourcc("IxFl") ? TSR_EUNSUPPORTED : TSR_EFORMAT,
                       "offset %zu: quantizer.fourcc: %s is not supported, expected \"IxF2\" "
                       "(IndexFlatL2) or \"IxFI\" (IndexFlatIP)",
                       at, fourcc_str(p->qfourcc, s));
    if ((rc = rd_index_header(c, "quantizer", &p->qh)) != 0)
        return rc;
    int32_t want_metric = p->qfourcc == fourcc("IxF2") ? 1 : 0;
    if (p->qh.metric != want_metric)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: quantizer.metric_type: %" PRId32 ", expected %" PRId32
                       " for a %s quantizer",
                       p->qh.metric_off, p->qh.metric, want_metric, fourcc_str(p->qfourcc, s));
    if (p->qh.d != p->ih.d)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: quantizer.d: %" PRId32 ", expected index d = %" PRId32,
                       p->qh.d_off, p->qh.d, p->ih.d);
    if ((uint64_t)p->qh.ntotal != p->nlist)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: quantizer.ntotal: %" PRId64 ", expected nlist = %" PRIu64,
                       p->qh.ntotal_off, p->qh.ntotal, p->nlist);
    at = c->off;
    size_t n;
    if ((rc = rd_vec(c, sizeof(float), "quantizer.centroids", "floats", &n, &p->cent_off)) != 0)
        return rc;
    if (n % (size_t)p->ih.d != 0 || n / (size_t)p->ih.d != p->nlist)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: quantizer.centroids: %zu floats, expected nlist * d = %" PRIu64
                       " * %" PRId32,
                       at, n, p->nlist, p->ih.d);

    at = c->off;
    RD(c, p->dm_type, "direct_map.type");
    if (p->dm_type > 2)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: direct_map.type: %u, expected 0 (NoMap), 1 (Array) or 2 "
                       "(Hashtable)",
                       at, p->dm_type);
    at = c->off;
    if ((rc = rd_vec(c, 8, "direct_map.array", "i64", &p->dm_arr_n, &p->dm_arr_off)) != 0)
        return rc;
    if (p->dm_type == 1 && p->dm_arr_n != (uint64_t)p->ih.ntotal)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: direct_map.array: %zu entries, expected ntotal = %" PRId64
                       " for an Array direct map",
                       at, p->dm_arr_n, p->ih.ntotal);
    if (p->dm_type != 1 && p->dm_arr_n != 0)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: direct_map.array: %zu entries, expected 0 for direct map "
                       "type %u",
                       at, p->dm_arr_n, p->dm_type);
    if (p->dm_type == 2) {
        at = c->off;
        if ((rc = rd_vec(c, 16, "direct_map.hashtable", "(i64, i64) pairs", &p->dm_hash_n,
                         &p->dm_hash_off)) != 0)
            return rc;
        if (p->dm_hash_n > (uint64_t)p->ih.ntotal)
            return tsr_err(c->err, TSR_EFORMAT,
                           "offset %zu: direct_map.hashtable: %zu pairs, expected at most ntotal "
                           "= %" PRId64,
                           at, p->dm_hash_n, p->ih.ntotal);
    }

    if ((rc = rd_bool(c, &p->by_residual, "by_residual")) != 0)
        return rc;
    size_t cs_off = c->off;
    RD(c, p->code_size, "code_size");
    if ((rc = rd_pq(c, "pq", p->ih.d, "index d", &p->pq)) != 0)
        return rc;
    if (p->code_size != p->pq.code_size)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: code_size: %" PRIu64 ", expected ceil(M * nbits / 8) = %zu",
                       cs_off, p->code_size, p->pq.code_size);
    if ((rc = rd_invlists(c, p)) != 0)
        return rc;

    if (p->top == fourcc("IwQR")) {
        if ((rc = rd_pq(c, "refine_pq", p->ih.d, "index d", &p->rpq)) != 0)
            return rc;
        at = c->off;
        if ((rc = rd_vec(c, 1, "refine_codes", "bytes", &p->rcodes_n, &p->rcodes_off)) != 0)
            return rc;
        uint64_t want = (uint64_t)p->ih.ntotal * p->rpq.code_size; /* both backed by file */
        if (p->rcodes_n != want)
            return tsr_err(c->err, TSR_EFORMAT,
                           "offset %zu: refine_codes: %zu bytes, expected ntotal * "
                           "refine code_size = %" PRIu64,
                           at, p->rcodes_n, want);
        RD(c, p->k_factor, "k_factor");
    }
    if (remain(c) != 0)
        return tsr_err(c->err, TSR_EFORMAT,
                       "offset %zu: end of index: %zu trailing bytes, expected end of file",
                       c->off, remain(c));
    return check_direct_map(c, p);
}

/* ---- build (pass 2) ------------------------------------------------------------------- */

static int build(const cursor *c, const parsed *p, tsr_ivfpq **out, tsr_error *err)
{
    tsr_ivfpq *ix = tsr_ivfpq_create(p->ih.d, (size_t)p->nlist, (size_t)p->pq.M,
                                     (size_t)p->pq.nbits, (enum tsr_metric)p->ih.metric,
                                     p->by_residual, err);
    if (ix == NULL)
        return err ? err->code : TSR_ENOMEM;
    const uint8_t *b = c->buf;
    size_t d = (size_t)p->ih.d;
    ix->ntotal = p->ih.ntotal;
    ix->is_trained = p->ih.is_trained;
    ix->nprobe = (size_t)p->nprobe;
    memcpy(ix->quantizer_fourcc, p->qfourcc == fourcc("IxF2") ? "IxF2" : "IxFI", 5);
    ix->quantizer_is_trained = p->qh.is_trained;
    memcpy(ix->centroids, b + p->cent_off, (size_t)p->nlist * d * sizeof(float));
    ix->dm_type = (enum tsr_direct_map)p->dm_type;
    if (p->dm_arr_n > 0) {
        ix->dm_array = tsr_try_malloc(p->dm_arr_n, sizeof(int64_t));
        if (ix->dm_array == NULL)
            goto nomem;
        memcpy(ix->dm_array, b + p->dm_arr_off, p->dm_arr_n * sizeof(int64_t));
        ix->dm_array_n = p->dm_arr_n;
    }
    if (p->dm_hash_n > 0) {
        ix->dm_hash = tsr_try_malloc(p->dm_hash_n, 2 * sizeof(int64_t));
        if (ix->dm_hash == NULL)
            goto nomem;
        memcpy(ix->dm_hash, b + p->dm_hash_off, p->dm_hash_n * 2 * sizeof(int64_t));
        ix->dm_hash_n = p->dm_hash_n;
    }
    memcpy(ix->pq.centroids, b + p->pq.cent_off, (size_t)(p->pq.d << p->pq.nbits) * sizeof(float));
    memcpy(ix->list_type, p->list_type == fourcc("full") ? "full" : "sprs", 5);
    size_t cs = ix->code_size, off = p->data_off;
    for (size_t i = 0; i < ix->nlist; i++) {
        size_t n = (size_t)p->sizes[i];
        if (n == 0)
            continue;
        tsr_invlist *l = &ix->lists[i];
        l->codes = tsr_try_malloc(n, cs);
        l->ids = tsr_try_malloc(n, sizeof(int64_t));
        if (l->codes == NULL || l->ids == NULL)
            goto nomem;
        memcpy(l->codes, b + off, n * cs);
        off += n * cs;
        memcpy(l->ids, b + off, n * sizeof(int64_t));
        off += n * sizeof(int64_t);
        l->size = l->cap = n;
    }
    if (p->top == fourcc("IwQR")) {
        ix->is_refine = 1;
        if (tsr_pq_init(&ix->refine_pq, (size_t)p->rpq.d, (size_t)p->rpq.M, (size_t)p->rpq.nbits,
                        err) != 0)
            goto fail;
        memcpy(ix->refine_pq.centroids, b + p->rpq.cent_off,
               (size_t)(p->rpq.d << p->rpq.nbits) * sizeof(float));
        if (p->rcodes_n > 0) {
            ix->refine_codes = tsr_try_malloc(p->rcodes_n, 1);
            if (ix->refine_codes == NULL)
                goto nomem;
            memcpy(ix->refine_codes, b + p->rcodes_off, p->rcodes_n);
        }
        ix->refine_codes_n = p->rcodes_n;
        ix->k_factor = p->k_factor;
    }
    *out = ix;
    return 0;
nomem:
    tsr_err(err, TSR_ENOMEM, "out of memory while loading the index");
fail:
    tsr_ivfpq_destroy(ix);
    return err ? err->code : TSR_ENOMEM;
}

int tsr_faiss_read_mem(const uint8_t *buf, size_t len, tsr_ivfpq **out, tsr_error *err)
{
    *out = NULL;
    tsr_error local = TSR_ERROR_INIT;
    if (err == NULL)
        err = &local;
    cursor c = {buf, len, 0, err};
    parsed p;
    memset(&p, 0, sizeof p);
    int rc = parse(&c, &p);
    if (rc == 0)
        rc = build(&c, &p, out, err);
    free(p.sizes);
    return rc;
}

int tsr_faiss_read_file(const char *path, tsr_ivfpq **out, tsr_error *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tsr_err(err, TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
        cap = (size_t)st.st_size + 1; /* +1 so that EOF is seen without a realloc */
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 1 << 16;
            uint8_t *nb = tsr_try_realloc(buf, ncap, 1);
            if (nb == NULL) {
                rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory reading %zu bytes", path, ncap);
                goto out;
            }
            buf = nb;
            cap = ncap;
        } else if (buf == NULL) {
            buf = tsr_try_malloc(cap, 1);
            if (buf == NULL) {
                rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory reading %zu bytes", path, cap);
                goto out;
            }
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = tsr_err(err, TSR_EIO, "%s: read error: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    rc = tsr_faiss_read_mem(buf, len, out, err);
    if (rc != 0)
        tsr_err_prefix(err, "%s", path);
out:
    free(buf);
    close(fd);
    return rc;
}

/* ---- writer --------------------------------------------------------------------------- */

/* Output goes to a growing memory buffer or through a tsr_file_writer (core/file.h). */
typedef struct {
    tsr_buf mem;
    tsr_file_writer *w;
    tsr_error *err; /* the writer's error goes here */
    int failed;
} sink;

static void put(sink *s, const void *p, size_t n)
{
    if (s->failed || n == 0)
        return;
    if (s->w != NULL) {
        s->failed = tsr_file_writer_add(s->w, p, n, s->err) != 0;
        return;
    }
    tsr_buf_add(&s->mem, p, n);
    s->failed = s->mem.oom;
}

static void put_u8(sink *s, uint8_t v) { put(s, &v, 1); }
static void put_i32(sink *s, int32_t v) { put(s, &v, 4); }
static void put_u32(sink *s, uint32_t v) { put(s, &v, 4); }
static void put_u64(sink *s, uint64_t v) { put(s, &v, 8); }
static void put_i64(sink *s, int64_t v) { put(s, &v, 8); }

static void put_index_header(sink *s, int d, int64_t ntotal, int is_trained, int32_t metric)
{
    put_i32(s, d);
    put_i64(s, ntotal);
    put_i64(s, FAISS_DUMMY);
    put_i64(s, FAISS_DUMMY);
    put_u8(s, is_trained ? 1 : 0);
    put_i32(s, metric);
}

static void put_pq(sink *s, const tsr_pq *pq)
{
    put_u64(s, pq->d);
    put_u64(s, pq->M);
    put_u64(s, pq->nbits);
    put_u64(s, pq->d * pq->ksub);
    put(s, pq->centroids, pq->d * pq->ksub * sizeof(float));
}

size_t tsr_faiss_nonempty_lists(const tsr_ivfpq *ix)
{
    size_t n = 0;
    for (size_t i = 0; i < ix->nlist; i++)
        n += ix->lists[i].size > 0;
    return n;
}

/* Refuses a struct that would produce a file the reader rejects. */
static int validate(const tsr_ivfpq *ix, tsr_error *err)
{
    if (ix->d <= 0 || ix->nlist == 0 || ix->centroids == NULL || ix->lists == NULL)
        return tsr_err(err, TSR_EINVAL, "faiss write: index has no shape (d=%d nlist=%zu)", ix->d,
                       ix->nlist);
    if (ix->metric != TSR_METRIC_L2 && ix->metric != TSR_METRIC_IP)
        return tsr_err(err, TSR_EINVAL, "faiss write: metric %d", (int)ix->metric);
    if (ix->pq.d != (size_t)ix->d || ix->pq.centroids == NULL || ix->code_size != ix->pq.code_size)
        return tsr_err(err, TSR_EINVAL, "faiss write: PQ d=%zu code_size=%zu for index d=%d "
                       "code_size=%zu", ix->pq.d, ix->pq.code_size, ix->d, ix->code_size);
    size_t sum = 0;
    for (size_t i = 0; i < ix->nlist; i++)
        sum += ix->lists[i].size;
    if (ix->ntotal < 0 || sum != (size_t)ix->ntotal)
        return tsr_err(err, TSR_EINVAL, "faiss write: ntotal %" PRId64 " but lists hold %zu",
                       ix->ntotal, sum);
    if ((ix->dm_type == TSR_DM_ARRAY && ix->dm_array_n != (size_t)ix->ntotal) ||
        (ix->dm_type != TSR_DM_ARRAY && ix->dm_array_n != 0) ||
        (ix->dm_type != TSR_DM_HASHTABLE && ix->dm_hash_n != 0) || (unsigned)ix->dm_type > 2)
        return tsr_err(err, TSR_EINVAL, "faiss write: direct map type %d with %zu array and %zu "
                       "hashtable entries for ntotal %" PRId64, (int)ix->dm_type, ix->dm_array_n,
                       ix->dm_hash_n, ix->ntotal);
    if (ix->is_refine && (ix->refine_pq.d != (size_t)ix->d || ix->refine_pq.centroids == NULL ||
                          ix->refine_codes_n != (size_t)ix->ntotal * ix->refine_pq.code_size))
        return tsr_err(err, TSR_EINVAL, "faiss write: refine PQ d=%zu with %zu refine code bytes "
                       "for ntotal %" PRId64, ix->refine_pq.d, ix->refine_codes_n, ix->ntotal);
    return 0;
}

static void serialize(const tsr_ivfpq *ix, sink *s)
{
    int ip_quantizer = strcmp(ix->quantizer_fourcc, "IxFI") == 0 ||
                       (ix->quantizer_fourcc[0] == '\0' && ix->metric == TSR_METRIC_IP);
    put_u32(s, fourcc(ix->is_refine ? "IwQR" : "IwPQ"));
    put_index_header(s, ix->d, ix->ntotal, ix->is_trained, (int32_t)ix->metric);
    put_u64(s, ix->nlist);
    put_u64(s, ix->nprobe);
    put_u32(s, fourcc(ip_quantizer ? "IxFI" : "IxF2"));
    put_index_header(s, ix->d, (int64_t)ix->nlist, ix->quantizer_is_trained, ip_quantizer ? 0 : 1);
    put_u64(s, ix->nlist * (size_t)ix->d);
    put(s, ix->centroids, ix->nlist * (size_t)ix->d * sizeof(float));
    put_u8(s, (uint8_t)ix->dm_type);
    put_u64(s, ix->dm_array_n);
    put(s, ix->dm_array, ix->dm_array_n * sizeof(int64_t));
    if (ix->dm_type == TSR_DM_HASHTABLE) {
        put_u64(s, ix->dm_hash_n);
        put(s, ix->dm_hash, ix->dm_hash_n * 2 * sizeof(int64_t));
    }
    put_u8(s, ix->by_residual ? 1 : 0);
    put_u64(s, ix->code_size);
    put_pq(s, &ix->pq);

    put_u32(s, fourcc("ilar"));
    put_u64(s, ix->nlist);
    put_u64(s, ix->code_size);
    size_t n_non0 = tsr_faiss_nonempty_lists(ix);
    if (n_non0 > ix->nlist / 2) { /* Faiss's rule, so a rewrite is byte-identical */
        put_u32(s, fourcc("full"));
        put_u64(s, ix->nlist);
        for (size_t i = 0; i < ix->nlist; i++)
            put_u64(s, ix->lists[i].size);
    } else {
        put_u32(s, fourcc("sprs"));
        put_u64(s, 2 * n_non0);
        for (size_t i = 0; i < ix->nlist; i++) {
            if (ix->lists[i].size > 0) {
                put_u64(s, i);
                put_u64(s, ix->lists[i].size);
            }
        }
    }
    for (size_t i = 0; i < ix->nlist; i++) {
        const tsr_invlist *l = &ix->lists[i];
        if (l->size == 0)
            continue;
        put(s, l->codes, l->size * ix->code_size);
        put(s, l->ids, l->size * sizeof(int64_t));
    }
    if (ix->is_refine) {
        put_pq(s, &ix->refine_pq);
        put_u64(s, ix->refine_codes_n);
        put(s, ix->refine_codes, ix->refine_codes_n);
        put(s, &ix->k_factor, sizeof(float));
    }
}

int tsr_faiss_write_mem(const tsr_ivfpq *ix, uint8_t **buf, size_t *len, tsr_error *err)
{
    *buf = NULL;
    *len = 0;
    int rc = validate(ix, err);
    if (rc != 0)
        return rc;
    sink s = {0};
    serialize(ix, &s);
    if (s.failed) {
        tsr_buf_free(&s.mem);
        return tsr_err(err, TSR_ENOMEM, "faiss write: out of memory");
    }
    *buf = (uint8_t *)s.mem.p;
    *len = s.mem.len;
    return 0;
}

int tsr_faiss_write_to(const tsr_ivfpq *ix, tsr_file_writer *w, tsr_error *err)
{
    int rc = validate(ix, err);
    if (rc != 0)
        return rc;
    sink s = {.w = w, .err = err};
    serialize(ix, &s);
    return s.failed ? (w->rc ? w->rc : TSR_EIO) : 0;
}

static int write_index(void *ix, tsr_file_writer *w, tsr_error *err)
{
    return tsr_faiss_write_to(ix, w, err);
}

int tsr_faiss_write_file(const tsr_ivfpq *ix, const char *path, tsr_error *err)
{
    int rc = validate(ix, err);
    if (rc != 0)
        return rc;
    return tsr_file_replace_by(path, (size_t)1 << 20, write_index, (void *)ix, err);
}
