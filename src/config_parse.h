/* SPDX-License-Identifier: MIT */
/*
 * The syntax of a CUDEFER_* value: text to a duration, a size, a count, a
 * switch or a policy, each taken whole and within bounds, or refused with
 * the reason.  The policy names and the time units are kept here alone;
 * config.c's formatters read them through the accessors below.  Nothing
 * here keeps state, takes a lock or blocks.
 */
#ifndef CUDEFER_CONFIG_PARSE_H
#define CUDEFER_CONFIG_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cudefer.h"

/* What reading a value found: a value within the bounds, or why not. */
enum config_parse_result {
    CONFIG_PARSE_OK,
    CONFIG_PARSE_NOT_UNDERSTOOD, /* not in the value's syntax */
    CONFIG_PARSE_OUT_OF_RANGE,   /* a value of the right kind, outside
                                    [min, max] */
    CONFIG_PARSE_NOT_WHOLE,      /* a duration finer than its unit: "1500us"
                                    in milliseconds */
    CONFIG_PARSE_NOT_POW2,       /* within the bounds, but not the power of
                                    two the knob wants (config.c's check: no
                                    parser here returns it) */
};

/* The number of policies config_parse_policy_word names (DEFER_POLICY_*
 * from 0), for the bounds of a table. */
#define CONFIG_PARSE_NPOLICIES 2

/* Any thread; never blocks.  Parsers of a whole string but the blanks
 * around it; true when it is valid and within [min, max], with the value in
 * *out; *out unchanged otherwise.  Units and words are read in any case.
 * Exposed for the tests.
 *   duration_us: digits with an optional unit "us", "ms", "s", "min" or
 *     "h"; microseconds.
 *   duration_ms: the same in milliseconds; a value in "us" must be a whole
 *     number of them ("2000us", not "1500us").
 *   size: digits with an optional binary multiple k, M, G, T or P, then an
 *     optional "B" (or "iB" after a multiple): "64M", "512MiB", "4096"; in
 *     [0, max] bytes.
 *   bool: the number 0 or 1 ("01" too), or false/true, no/yes, off/on.
 *   policy: "batched" or "eager". */
bool config_parse_duration_us(const char *text, uint64_t min_us,
                              uint64_t max_us, uint64_t *out);
bool config_parse_duration_ms(const char *text, uint64_t min_ms,
                              uint64_t max_ms, uint64_t *out);
bool config_parse_size(const char *text, uint64_t max, uint64_t *out);
bool config_parse_bool(const char *text, bool *out);
bool config_parse_policy(const char *text, enum defer_policy *out);

/* Any thread; never blocks.  text without the blanks around it (spaces,
 * tabs, carriage returns, newlines), copied into buf (len bytes).  Returns
 * buf, or NULL when that is longer than len - 1 bytes (then no value is
 * understood). */
const char *config_parse_trim(const char *text, char *buf, size_t len);

/* The parsers below take text already trimmed (config_parse_trim): a blank
 * anywhere is not understood.  Each returns CONFIG_PARSE_OK with the value
 * in *out, or the reason it refused the text (*out then unchanged). */

/* Any thread; never blocks.  A duration counted in units of base_us
 * microseconds (1: microseconds, 1000: milliseconds): digits alone, in that
 * unit, or digits and a time unit, a whole number of the base
 * (CONFIG_PARSE_NOT_WHOLE otherwise); within [min, max] of the base. */
enum config_parse_result config_parse_duration(const char *text,
                                               uint64_t base_us, uint64_t min,
                                               uint64_t max, uint64_t *out);

/* Any thread; never blocks.  Bytes: digits with an optional binary multiple
 * and "B" (see config_parse_size), within [min, max]; a product past 64
 * bits is out of range. */
enum config_parse_result config_parse_size_within(const char *text,
                                                  uint64_t min, uint64_t max,
                                                  uint64_t *out);

/* Any thread; never blocks.  A plain number (digits only) within
 * [min, max]. */
enum config_parse_result config_parse_count(const char *text, uint64_t min,
                                            uint64_t max, uint64_t *out);

/* Any thread; never blocks.  A switch: the number 0 or 1 ("01" too), or
 * false/true, no/yes, off/on in any case.  Never out of range: any other
 * number is not understood. */
enum config_parse_result config_parse_switch(const char *text, bool *out);

/* Any thread; never blocks.  A policy's name, in any case. */
enum config_parse_result config_parse_policy_name(const char *text,
                                                  enum defer_policy *out);

/* Any thread; never blocks.  Returns the name of policy i as the
 * environment spells it ("batched"), or NULL when i is no policy. */
const char *config_parse_policy_word(uint64_t i);

/* Any thread; never blocks.  Time unit i (0, 1, ... from the finest):
 * its suffix ("us", "ms", "s", "min", "h") in *suffix and its length in
 * microseconds in *us.  Returns false past the last (*suffix and *us
 * unchanged). */
bool config_parse_time_unit(size_t i, const char **suffix, uint64_t *us);

/* Any thread; never blocks.  The edit distance (insertions, deletions,
 * substitutions) between the n bytes at a and the string b, for naming the
 * knob a misspelt variable was likely meant to be; SIZE_MAX when either is
 * 64 bytes or longer. */
size_t config_parse_distance(const char *a, size_t n, const char *b);

#endif
