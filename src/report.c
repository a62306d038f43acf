/* SPDX-License-Identifier: MIT */
/* Diagnostics on stderr, one whole line per message: one write(2) of the
 * line, so lines of concurrent threads do not interleave, and no stdio lock
 * is taken (a fork child inherits stderr's lock as it was: held for ever
 * when a thread of the parent was printing). */
#include "report.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void report(const char *fmt, ...)
{
    static const char prefix[] = "cudefer: ";
    char line[512];
    size_t len = sizeof prefix - 1;
    memcpy(line, prefix, len);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + len, sizeof line - len - 1, fmt, ap);
    va_end(ap);
    if (n > 0)
        len += (size_t)n < sizeof line - len - 1 ? (size_t)n
                                                 : sizeof line - len - 2;
    line[len++] = '\n';
    for (size_t done = 0; done < len;) {
        ssize_t w = write(STDERR_FILENO, line + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* stderr is closed or broken: nothing else to tell */
        done += (size_t)w;
    }
}

const char *report_line_end(const struct line_end *end, char *buf,
                            size_t size)
{
    if (end == NULL)
        snprintf(buf, size, "%s", "");
    else if (end->kind == LINE_END_NULL_RETURNED)
        snprintf(buf, size, "; returning NULL for %zu bytes on device %d",
                 end->bytes, end->device);
    else
        snprintf(buf, size, "; %p stays allocated", end->ptr);
    return buf;
}
