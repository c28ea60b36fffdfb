/* cmd_batch — placeholder until the module lands; replaced by its owner. */
#include <stdio.h>
#include "cli.h"
int tsr_cmd_batch_inspect(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tessera: batch_inspect: not built yet\n"); return 2; }
