/*
 * log — one-line leveled logging to stderr, with the program name and a timestamp.
 * Thread-safe (one fprintf per line). TSR_LOG_LEVEL env (debug|info|warn|error) sets
 * the threshold; default info. tsr_log_every is the rate-limited form for events a peer
 * can repeat at will (a client calling an unknown method, a replica failing over).
 */
#ifndef TSR_LOG_H
#define TSR_LOG_H

enum tsr_log_level { TSR_LOG_DEBUG = 0, TSR_LOG_INFO, TSR_LOG_WARN, TSR_LOG_ERROR };

void tsr_log_set_program(const char *name); /* borrows name (must outlive logging) */
void tsr_log(enum tsr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Rate-limited tsr_log: at most one line per `key` every `every_ms` milliseconds
 * (monotonic clock). Calls in between print nothing and are counted; the next line printed
 * for that key ends with " (N more since the last line)". Keys compare by their first
 * TSR_LOG_KEY_MAX - 1 bytes; TSR_LOG_KEYS keys are remembered: a key whose window has
 * passed is forgotten for a new one, and while every remembered key is inside its window a
 * new key's line is dropped and counted, the count ending the next line printed ("; N lines
 * of other keys suppressed") — a peer inventing keys cannot flood the log. Control
 * characters of the line (keys and arguments may come from a client) print as '?'.
 * Returns 1 when the line was printed, 0 when suppressed or below the level threshold. */
#define TSR_LOG_KEYS 64
#define TSR_LOG_KEY_MAX 128
int tsr_log_every(enum tsr_log_level level, const char *key, long long every_ms,
                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define tsr_debug(...) tsr_log(TSR_LOG_DEBUG, __VA_ARGS__)
#define tsr_info(...) tsr_log(TSR_LOG_INFO, __VA_ARGS__)
#define tsr_warn(...) tsr_log(TSR_LOG_WARN, __VA_ARGS__)
#define tsr_error_log(...) tsr_log(TSR_LOG_ERROR, __VA_ARGS__)

#endif
