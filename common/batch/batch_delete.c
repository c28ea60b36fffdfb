/*
 * batch_delete — delete-file reader. A line is the id verbatim (after removing "\r\n" or
 * "\n"); a line of only spaces/tabs is blank and skipped. Ids are not trimmed, the same
 * as CSV ids, so an id round-trips exactly.
 */
#include "batch/batch_delete.h"

#include <string.h>

#include "batch/batch_int.h"

/* One line (tsr__line_fn); ctx is the sink. */
static int delete_line(void *ctx, const tsr__lines *r, const char *line, size_t len,
                       int too_long, tsr_error *err)
{
    (void)err;
    const tsr_record_sink *sink = ctx;
    if (too_long)
        return tsr__lines_too_long(r, sink, TSR_REC_INVALID_EMBEDDING_ID);
    if (tsr__blank(line, len))
        return 0; /* blank line */
    if (!tsr__utf8_valid(line, len))
        return sink->invalid(sink->ctx, r->lineno, TSR_REC_INVALID_ENCODING,
                             "the id is not valid UTF-8") != 0;
    if (memchr(line, '\0', len) != NULL)
        return sink->invalid(sink->ctx, r->lineno, TSR_REC_INVALID_EMBEDDING_ID,
                             "the id contains a NUL byte") != 0;
    return sink->delete_id(sink->ctx, r->lineno, line, len) != 0;
}

int tsr_batch_delete_read(const char *path, size_t dims, const tsr_record_sink *sink,
                          tsr_error *err)
{
    (void)dims;
    return tsr__lines_run(path, NULL, 0, delete_line, (void *)sink, err);
}

int tsr_batch_delete_read_mem(const void *data, size_t len, const tsr_record_sink *sink,
                              tsr_error *err)
{
    return tsr__lines_run(NULL, data, len, delete_line, (void *)sink, err);
}
