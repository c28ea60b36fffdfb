/*
 * batch_delete — delete-file reader. A line is the id verbatim (after removing "\r\n" or
 * "\n"); a line of only spaces/tabs is blank and skipped. Ids are not trimmed, the same
 * as CSV ids, so an id round-trips exactly.
 */
#include "batch_delete.h"

#include <stdio.h>
#include <string.h>

#include "batch_util.h"

static int read_lines(tsr__lines *r, const tsr_record_sink *sink, tsr_error *err)
{
    int rc;
    const char *line;
    size_t len;
    int too_long;
    char msg[128];
    while ((rc = tsr__lines_next(r, &line, &len, &too_long, err)) == 1) {
        int stop = 0;
        size_t i = 0;
        while (i < len && (line[i] == ' ' || line[i] == '\t'))
            i++;
        if (too_long) {
            snprintf(msg, sizeof msg, "line longer than the %zu-byte limit; skipped", r->max_line);
            stop = sink->invalid(sink->ctx, r->lineno, TSR_REC_INVALID_EMBEDDING_ID, msg);
        } else if (i == len) {
            continue; /* blank line */
        } else if (!tsr__utf8_valid(line, len)) {
            stop = sink->invalid(sink->ctx, r->lineno, TSR_REC_INVALID_ENCODING,
                                 "the id is not valid UTF-8");
        } else if (memchr(line, '\0', len) != NULL) {
            stop = sink->invalid(sink->ctx, r->lineno, TSR_REC_INVALID_EMBEDDING_ID,
                                 "the id contains a NUL byte");
        } else {
            stop = sink->delete_id(sink->ctx, r->lineno, line, len);
        }
        if (stop)
            return 0;
    }
    return rc < 0 ? rc : 0;
}

int tsr_batch_delete_read(const char *path, size_t dims, const tsr_record_sink *sink,
                          tsr_error *err)
{
    (void)dims;
    tsr__lines r;
    int rc = tsr__lines_open(&r, path, err);
    if (rc != 0)
        return rc;
    rc = read_lines(&r, sink, err);
    tsr__lines_close(&r);
    if (rc != 0)
        tsr_err_prefix(err, "%s", path);
    return rc;
}

int tsr_batch_delete_read_mem(const void *data, size_t len, const tsr_record_sink *sink,
                              tsr_error *err)
{
    tsr__lines r;
    tsr__lines_init_mem(&r, data, len);
    int rc = read_lines(&r, sink, err);
    tsr__lines_close(&r);
    return rc;
}
