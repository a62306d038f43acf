/* SPDX-License-Identifier: MIT */
/* Diagnostics: every message cudefer prints goes to stderr as one line that
 * starts with "cudefer: " (a failed CUDA call's through cuda_report_failure,
 * cuda.h). */
#ifndef CUDEFER_REPORT_H
#define CUDEFER_REPORT_H

/* Any thread.  Prints "cudefer: <message>\n" on stderr. */
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
