/*
 * log — one-line leveled logging to stderr, with the program name and a timestamp.
 * Thread-safe (one fprintf per line). TSR_LOG_LEVEL env (debug|info|warn|error) sets
 * the threshold; default info.
 */
#ifndef TSR_LOG_H
#define TSR_LOG_H

enum tsr_log_level { TSR_LOG_DEBUG = 0, TSR_LOG_INFO, TSR_LOG_WARN, TSR_LOG_ERROR };

void tsr_log_set_program(const char *name); /* borrows name (must outlive logging) */
void tsr_log(enum tsr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define tsr_debug(...) tsr_log(TSR_LOG_DEBUG, __VA_ARGS__)
#define tsr_info(...) tsr_log(TSR_LOG_INFO, __VA_ARGS__)
#define tsr_warn(...) tsr_log(TSR_LOG_WARN, __VA_ARGS__)
#define tsr_error_log(...) tsr_log(TSR_LOG_ERROR, __VA_ARGS__)

#endif
