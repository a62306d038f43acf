/* SPDX-License-Identifier: MIT */
/* The pool stack on its own (src/pool_stack.h): chains cut into batches,
 * the bound, whole-batch and one-item pops, the kept reserve, and every
 * item accounted for (pushed, popped, or returned as did not fit). */
#include <stdlib.h>

#include "helpers.h"
#include "pool_stack.h"

#define ITEMS 200

static struct pool_link items[ITEMS];

/* A chain of items [from, to). */
static struct pool_link *chain(int from, int to)
{
    for (int i = from; i < to; i++)
        items[i].next = i + 1 < to ? &items[i + 1] : NULL;
    return from < to ? &items[from] : NULL;
}

static size_t chain_length(struct pool_link *l)
{
    size_t n = 0;
    for (; l != NULL; l = l->next)
        n++;
    return n;
}

/* Items in a stack of batches (as push returns), each batch's count
 * checked against its chain. */
static size_t batches_length(struct pool_link *b, int *counts_ok)
{
    size_t n = 0;
    for (; b != NULL; b = pool_stack_next_batch(b)) {
        size_t k = chain_length(b);
        *counts_ok &= k == b->batch_count;
        n += k;
    }
    return n;
}

static void test_push_pop(void)
{
    struct pool_stack s = {0};
    pool_stack_init(&s);
    size_t kept, got;
    int counts_ok = 1;
    struct pool_link *rest = pool_stack_push(&s, chain(0, 70), 32, 1000, &kept);
    ok(rest == NULL && kept == 70 && pool_stack_count(&s) == 70,
       "70 items pushed in batches of 32 (kept %zu)", kept);
    struct pool_link *b = pool_stack_pop(&s, 32, 0, &got);
    is_int(got, 32, "the top batch is the chain's first 32 items");
    ok(b == &items[0] && chain_length(b) == 32, "chained, NULL-terminated");
    b = pool_stack_pop(&s, 32, 0, &got);
    ok(got == 32 && b == &items[32], "then the next 32");
    b = pool_stack_pop(&s, 1, 0, &got);
    is_int(got, 1, "one item when one is asked for");
    ok(b == &items[64] && b->next == NULL, "alone");
    b = pool_stack_pop(&s, 32, 0, &got);
    ok(got == 5 && b == &items[65] && chain_length(b) == 5,
       "the rest of its batch stays a batch (5)");
    is_int(pool_stack_count(&s), 0, "empty");
    b = pool_stack_pop(&s, 32, 0, &got);
    ok(b == NULL && got == 0, "nothing from an empty stack");

    rest = pool_stack_push(&s, chain(0, 50), 32, 40, &kept);
    size_t left = batches_length(rest, &counts_ok);
    ok(kept == 40 && left == 10 && counts_ok,
       "bound 40: 40 kept, 10 returned as batches (kept %zu, left %zu)",
       kept, left);
    rest = pool_stack_push(&s, chain(50, 60), 32, 40, &kept);
    ok(kept == 0 && batches_length(rest, &counts_ok) == 10 && counts_ok,
       "a full stack keeps none");
    is_int(pool_stack_count(&s), 40, "40 in the stack");

    b = pool_stack_pop(&s, 32, 35, &got);
    is_int(got, 1, "keep 35 of 40: a batch would leave fewer, so one item");
    b = pool_stack_pop(&s, 32, 39, &got);
    ok(b == NULL && got == 0, "keep 39 of 39: none");
    size_t total = pool_stack_count(&s);
    while ((b = pool_stack_pop(&s, 32, 0, &got)) != NULL)
        total -= got;
    is_int(total, 0, "every item popped once");
    ok(pool_stack_take_all(&s) == NULL, "empty at the end");
}

/* Random pushes and pops: the count always equals the items inside, and
 * every item is either inside or out, never both. */
static void test_random(void)
{
    struct pool_stack s = {0};
    pool_stack_init(&s);
    int inside[ITEMS] = {0}, good = 1;
    srand(7);
    for (int round = 0; round < 20000; round++) {
        if (rand() % 2) {
            /* push a random run of items that are out */
            struct pool_link *first = NULL, *last = NULL;
            int want = 1 + rand() % 40, n = 0;
            for (int i = rand() % ITEMS, t = 0; t < ITEMS && n < want;
                 t++, i = (i + 1) % ITEMS) {
                if (inside[i])
                    continue;
                items[i].next = NULL;
                if (last != NULL)
                    last->next = &items[i];
                else
                    first = &items[i];
                last = &items[i];
                inside[i] = 1;
                n++;
            }
            size_t kept;
            struct pool_link *rest =
                pool_stack_push(&s, first, 1 + rand() % 32, 150, &kept);
            for (struct pool_link *b = rest; b != NULL;
                 b = pool_stack_next_batch(b))
                for (struct pool_link *l = b; l != NULL; l = l->next)
                    inside[l - items] = 0;
            good &= kept <= (size_t)n;
        } else {
            size_t got;
            struct pool_link *l =
                pool_stack_pop(&s, 1 + rand() % 40, rand() % 20, &got);
            good &= chain_length(l) == got;
            for (; l != NULL; l = l->next) {
                good &= inside[l - items];
                inside[l - items] = 0;
            }
        }
        size_t n = 0;
        for (int i = 0; i < ITEMS; i++)
            n += inside[i];
        good &= n == pool_stack_count(&s) && n <= 150;
    }
    ok(good, "20,000 random pushes and pops: counts and items agree, the "
             "bound holds");
}

int main(void)
{
    plan_lazy();
    test_push_pop();
    test_random();
    return 0;
}
