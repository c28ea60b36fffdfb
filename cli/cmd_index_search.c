/* cmd_index_search — placeholder until the module lands; replaced by its owner. */
#include <stdio.h>
#include "cli.h"
int tsr_cmd_index_search(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tessera: index_search: not built yet\n"); return 2; }
