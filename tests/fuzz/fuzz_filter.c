/*
 * fuzz_filter — libFuzzer harness for filter compile + match: the input bytes describe a
 * few datapoints (token restricts in three namespaces, an optional numeric value) and a
 * query; every row's answer is checked against a direct reading of SPEC §3, and invalid
 * operators must be rejected, never crash.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query/filter.h"

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;

static unsigned next(rd *r)
{
    if (r->n == 0)
        return 0;
    r->n--;
    return *r->p++;
}

static const char *NS[] = {"a", "b", "c"};
static const char *TOK[] = {"t0", "t1", "t2", "t3", "zz"}; /* zz: never in a datapoint */

typedef struct row {
    unsigned allow[3], deny[3]; /* bit masks over TOK[0..3] */
    int has_num, num_int;
    int64_t iv;
    double dv;
} row;

static int cmp_ok(int dint, int64_t di, double dd, int qint, int64_t qi, double qd, int op)
{
    int lt, eq;
    if (dint && qint) {
        lt = di < qi;
        eq = di == qi;
    } else {
        double a = dint ? (double)di : dd, b = qint ? (double)qi : qd;
        lt = a < b;
        eq = a == b;
    }
    switch (op) {
    case TSR_OP_LESS: return lt;
    case TSR_OP_LESS_EQUAL: return lt || eq;
    case TSR_OP_EQUAL: return eq;
    case TSR_OP_GREATER_EQUAL: return !lt;
    case TSR_OP_GREATER: return !lt && !eq;
    default: return !eq;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd r = {data, size};
    row rows[16];
    size_t nrows = 1 + next(&r) % 16;
    tsr_filter_dict *d = tsr_filter_dict_create();
    tsr_filter_meta *m = tsr_filter_meta_create(d);
    for (size_t i = 0; i < nrows; i++) {
        row *w = &rows[i];
        memset(w, 0, sizeof *w);
        tsr_token_restrict tr[3];
        char *al[3][4], *de[3][4];
        size_t ntr = 0;
        for (int ns = 0; ns < 3; ns++) {
            unsigned b = next(&r);
            w->allow[ns] = b & 15;
            w->deny[ns] = b >> 4;
            if (!b)
                continue;
            tr[ntr] = (tsr_token_restrict){(char *)NS[ns], al[ntr], 0, de[ntr], 0};
            for (int t = 0; t < 4; t++) {
                if (w->allow[ns] >> t & 1)
                    al[ntr][tr[ntr].nallow++] = (char *)TOK[t];
                if (w->deny[ns] >> t & 1)
                    de[ntr][tr[ntr].ndeny++] = (char *)TOK[t];
            }
            ntr++;
        }
        unsigned nb = next(&r);
        tsr_numeric_restrict num = {(char *)"x", TSR_NUM_INT, {.i = 0}};
        if (nb & 1) {
            w->has_num = 1;
            w->num_int = (nb >> 1) % 3 == 0;
            int v = (int)(int8_t)next(&r);
            if (w->num_int) {
                num.type = TSR_NUM_INT;
                num.v.i = w->iv = v;
            } else if ((nb >> 1) % 3 == 1) {
                num.type = TSR_NUM_FLOAT;
                num.v.f = (float)v / 4.0f;
                w->dv = (double)num.v.f;
            } else {
                num.type = TSR_NUM_DOUBLE;
                num.v.d = w->dv = (double)v / 4.0;
            }
        }
        tsr_datapoint dp = {0};
        dp.restricts = tr;
        dp.nrestricts = ntr;
        dp.numeric = &num;
        dp.nnumeric = (size_t)w->has_num;
        if (tsr_filter_meta_add(m, (int64_t)i, &dp, NULL, NULL) != 0)
            abort();
    }
    /* the query */
    unsigned qa[3] = {0}, qd[3] = {0};
    int named[3] = {0};
    tsr_token_restrict q[3];
    char *qal[3][5], *qde[3][5];
    size_t nq = 0;
    for (int ns = 0; ns < 3; ns++) {
        unsigned b = next(&r);
        if (!(b & 1))
            continue;
        named[ns] = 1;
        unsigned c = next(&r);
        qa[ns] = (b >> 1) & 31;
        qd[ns] = c & 31;
        q[nq] = (tsr_token_restrict){(char *)NS[ns], qal[nq], 0, qde[nq], 0};
        for (int t = 0; t < 5; t++) {
            if (qa[ns] >> t & 1)
                qal[nq][q[nq].nallow++] = (char *)TOK[t];
            if (qd[ns] >> t & 1)
                qde[nq][q[nq].ndeny++] = (char *)TOK[t];
        }
        nq++;
    }
    unsigned nb = next(&r);
    tsr_numeric_query nqy = {"x", TSR_NUM_INT, {.i = 0}, TSR_OP_UNSPECIFIED};
    int qint = 0;
    int64_t qiv = 0;
    double qdv = 0;
    size_t nn = 0;
    if (nb & 1) {
        nn = 1;
        nqy.op = (enum tsr_num_op)((nb >> 1) % 8);
        int v = (int)(int8_t)next(&r);
        int ty = (int)((nb >> 4) % 3);
        qint = ty == 0;
        if (ty == 0)
            nqy.type = TSR_NUM_INT, nqy.v.i = qiv = v;
        else if (ty == 1)
            nqy.type = TSR_NUM_FLOAT, nqy.v.f = (float)v / 4.0f, qdv = (double)nqy.v.f;
        else
            nqy.type = TSR_NUM_DOUBLE, nqy.v.d = qdv = (double)v / 4.0;
    }
    tsr_filter *f = NULL;
    int rc = tsr_filter_compile(d, q, nq, &nqy, nn, &f, NULL);
    if (nn && (nqy.op < TSR_OP_LESS || nqy.op > TSR_OP_NOT_EQUAL)) {
        if (rc != TSR_EINVAL)
            abort();
        goto done;
    }
    if (rc != 0)
        abort();
    for (size_t i = 0; i < nrows; i++) {
        const row *w = &rows[i];
        int want = 1;
        for (int ns = 0; ns < 3 && want; ns++) {
            if (!named[ns])
                continue;
            unsigned known_qa = qa[ns] & 15;
            if (w->allow[ns] & qd[ns] & 15)
                want = 0;
            else if (w->deny[ns] & known_qa)
                want = 0;
            else if (qa[ns] && !(w->allow[ns] & known_qa))
                want = 0;
        }
        if (want && nn) {
            if (!w->has_num)
                want = 0;
            else
                want = cmp_ok(w->num_int, w->iv, w->dv, qint, qiv, qdv, nqy.op);
        }
        if (tsr_filter_match(f, m, (uint32_t)i) != want)
            abort();
    }
done:
    tsr_filter_destroy(f);
    tsr_filter_meta_destroy(m);
    tsr_filter_dict_destroy(d);
    return 0;
}
