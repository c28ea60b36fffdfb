/*
 * arena — one request's allocations (arena.c): everything one request allocates (plans,
 * shard requests, the unpacked shard replies, the response) comes from bump blocks that
 * are freed together: one calloc per block instead of one per object (~60 per query
 * plus ~100 in the unpacked replies). Memory is zeroed (fresh calloc blocks are never
 * reused). Owned by one request at a time: no lock.
 */
#ifndef TSR_COORD_ARENA_H
#define TSR_COORD_ARENA_H

#include <stddef.h>

typedef struct arena {
    void **p; /* owned blocks */
    size_t n, cap;
    char *cur; /* free part of the current block */
    size_t left;
} tsr__arena;

void *tsr__ar(tsr__arena *a, size_t n, size_t size);

/* Hands x (a malloc'd block) to the arena: freed with it. */
void tsr__ar_own(tsr__arena *a, void *x);

void tsr__ar_free(tsr__arena *a);

#endif
