/* Preloaded into tritonserver by the launcher (serving/launcher/secret_args.py) to keep secret arguments off its command
 * line: /proc/<pid>/cmdline is readable by every local user, and Triton 2.51 reads the model-repository key only
 * from its arguments.
 *
 * The launcher passes each secret argument as "--ropeserve-secret-argument=N" and its value in the environment
 * variable ROPESERVE_SECRET_ARGUMENT_N (readable by the server's own user only). Before Triton's main() runs, this
 * constructor points argv[i] at a copy of the value: main() sees the real argument, while /proc/<pid>/cmdline
 * still shows the placeholder (the kernel reads the original argument block). The variable's value is then
 * overwritten in place (/proc/<pid>/environ shows the original environment block) and removed, so nothing Triton
 * starts inherits it. A placeholder without its variable stays as it is, and Triton refuses the unknown option. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char PLACEHOLDER[] = "--ropeserve-secret-argument=";
static const char VARIABLE[] = "ROPESERVE_SECRET_ARGUMENT_";

static void reveal(int argc, char **argv, char **envp) {
    (void)envp;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], PLACEHOLDER, sizeof PLACEHOLDER - 1) != 0) continue;
        char name[96];
        snprintf(name, sizeof name, "%s%s", VARIABLE, argv[i] + sizeof PLACEHOLDER - 1);
        char *value = getenv(name);
        if (value == NULL) continue;
        char *copy = strdup(value);
        if (copy == NULL) continue;
        argv[i] = copy;
        memset(value, '*', strlen(value));
        unsetenv(name);
    }
}

/* glibc calls .init_array entries of a preloaded library with (argc, argv, envp) before main(). */
__attribute__((section(".init_array"), used)) static void (*const reveal_at_start)(int, char **, char **) = reveal;
