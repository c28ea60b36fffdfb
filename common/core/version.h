/*
 * version — the release of Tessera, in one place: `tessera --version` prints it. Change
 * it here when cutting a release (semantic versioning: MAJOR.MINOR.PATCH).
 */
#ifndef TSR_VERSION_H
#define TSR_VERSION_H

#define TSR_VERSION "0.1.0"

#endif
