/* cmd_index_io — placeholder until the module lands; replaced by its owner. */
#include <stdio.h>
#include "cli.h"
int tsr_cmd_index_check(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tessera: index_check: not built yet\n"); return 2; }
int tsr_cmd_index_info(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tessera: index_info: not built yet\n"); return 2; }
int tsr_cmd_index_rewrite(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tessera: index_rewrite: not built yet\n"); return 2; }
