#include <memsim/alloc.h>
int main(void) { return 0; }
