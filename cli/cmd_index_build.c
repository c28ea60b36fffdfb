/* cmd_index_build — placeholder until the module lands; replaced by its owner. */
#include <stdio.h>
#include "cli.h"
int tsr_cmd_index_build(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tessera: index_build: not built yet\n"); return 2; }
