/* SPDX-License-Identifier: MIT */
/* Diagnostics: every message cudefer prints goes to stderr as one line that
 * starts with "cudefer: " (a failed CUDA call's through cuda_report_failure,
 * cuda.h). */
#ifndef CUDEFER_REPORT_H
#define CUDEFER_REPORT_H

#include <stddef.h>

/* Any thread.  Prints "cudefer: <message>\n" on stderr. */
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The end a caller adds to each failure line of its request, made only
 * when a line is said: formatted on every call, it would cost the hot path
 * a cold vfprintf.  A NULL end adds nothing. */
struct line_end {
    enum {
        LINE_END_NULL_RETURNED,   /* "; returning NULL for B bytes on device D" */
        LINE_END_STAYS_ALLOCATED, /* "; PTR stays allocated" */
    } kind;
    size_t bytes;
    int device;
    const void *ptr;
};

/* Any thread; never blocks.  end's text in buf (size bytes), or "" for a
 * NULL end; returns buf. */
const char *report_line_end(const struct line_end *end, char *buf,
                            size_t size);

#endif
