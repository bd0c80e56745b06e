/* Shared helpers for the Criterion tests. */
#ifndef MEMSIM_TESTUTIL_H
#define MEMSIM_TESTUTIL_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <memsim/trace.h>

/* Folder of the shared real data (../shared/data), or NULL when it is absent. */
const char *tu_shared_data(void);
/* Path under the shared data folder; skips the current test with a clear message when the
 * folder is absent. Returns a newly allocated path. */
char *tu_shared_path_or_skip(const char *relative);
/* Says that a part of a test (`what`) was skipped and why: on stderr and in $MEMSIM_SKIP_LOG,
 * which tools/run-tests.sh lists (a whole skipped Criterion test is noted by itself). */
void tu_note_skip(const char *what, const char *why);
/* The trace memsim_generate makes of a model (preset or config.json) and run settings given as
 * key, value, ..., NULL (memsim_run_set's names); a failure fails the test. */
MemsimTrace *tu_generate(const char *model, const char *const *settings);
/* Path of a file under tests/data. Newly allocated. */
char *tu_test_data(const char *relative);
/* Runs argv (argv[0] found on PATH) with the environment plus `env` (NULL-terminated "K=V"
 * list, may be NULL); returns its exit status (128 + the signal if killed) and, if not NULL,
 * its stdout and stderr (newly allocated). */
int tu_run(const char *const *argv, const char *const *env, char **out, char **err);
/* Runs the memsim command with argv (NULL-terminated, without the program name); returns its
 * exit status and, if not NULL, its stdout and stderr (newly allocated). */
int tu_run_memsim(const char *const *argv, char **out, char **err);
/* Whether this build runs under sanitizers (MEMSIM_SANITIZE), which multiply time and
 * memory: bounds on either are relaxed or left out there. */
gboolean tu_sanitized(void);
/* The bound on what a hostile input may cost the command: 5 s and 500 MiB, four times both
 * under the sanitizers (their shadow memory and checks). */
double tu_limit_s(void);
double tu_limit_mib(void);
/* The largest resident set of the child processes waited for so far, in MiB. */
double tu_children_peak_mib(void);
/* The CPU seconds (user + system) of the children waited for so far (getrusage): a bound on
 * work that a loaded machine does not stretch as it stretches wall time. */
double tu_children_cpu_s(void);
/* A pickle (protocol 2) of a list of n Nones: PROTO, EMPTY_LIST, then MARK, NONE × run, APPENDS
 * in runs of `batch` (0: one run of n) as Python's pickle.dumps([None] * n) writes them with
 * batch 1000, then STOP. */
GByteArray *tu_none_flood_pickle(gsize n, gsize batch);
/* A fresh temporary directory (removed by the OS's tmp cleaning). Newly allocated. */
char *tu_tmpdir(void);

/* ---- comparisons with real recordings (test_reference*.c) ---- */

/* Runs tests/reference/SCRIPT with Debian's python3 (torch 1.13) into a new temporary folder
 * and returns it; skips the test, saying why, when python3 or its torch is absent. */
char *tu_record_reference(const char *script);
/* A recorded case (its JSON object: "case", "config", "batch", "seq", "steps"): its config
 * written into `dir` and loaded, and its batch, sequence and steps set on `run`. */
MemsimModel *tu_case_load(JsonObject *c, const char *dir, MemsimRun *run);
/* Sets a run setting; fails the test naming it when refused. */
void tu_set(MemsimRun *run, const char *key, const char *value);
/* The peaks of step `step` of a rank's report, or NULL. */
const MemsimStepPeaks *tu_step_of(const MemsimRankReport *r, uint32_t step);
/* Live requested bytes by category at the peak of each (step, phase) of one rank of a trace; a
 * step begins where the forward begins again (step 0 unused). A recorder calls activation what
 * a forward leaves alive at its end and cannot tell communication buffers from other tensors,
 * the generator calls activation what autograd saves: activations, temporaries, the KV cache
 * and communication buffers are one bucket, filed as activation; parameters, gradients,
 * optimizer state, inputs and buffers are each their own. */
typedef struct {
    int64_t total;
    int64_t cat[MEMSIM_CAT_COUNT];
} TuPhasePeak;
#define TU_MAX_STEPS 8
void tu_category_peaks(MemsimTrace *t, guint32 rank,
                       TuPhasePeak peaks[TU_MAX_STEPS][MEMSIM_PHASE_COUNT]);

/* The most bytes of category `cat` the program of rank 0 holds at once (between its ALLOC and
 * FREE events, the program's view), over the events of `phase` (or all, with -1). */
int64_t tu_peak_live(MemsimTrace *t, uint8_t cat, int phase);

#endif
