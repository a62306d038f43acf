/* Held lists with size-class shelves: see held.h. */
#include "held.h"

#define MIN_CLASS_SHIFT 9 /* 512 bytes */

int size_class_of(size_t bytes, size_t *class_bytes)
{
    if (bytes <= ((size_t)1 << MIN_CLASS_SHIFT)) {
        *class_bytes = (size_t)1 << MIN_CLASS_SHIFT;
        return 0;
    }
    int k = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^k < bytes */
    size_t base = (size_t)1 << k, quarter = base / 4;
    int step = (int)((bytes - base + quarter - 1) / quarter); /* 1..4 */
    int cls = (k - MIN_CLASS_SHIFT) * 4 + step;
    if (cls >= SIZE_CLASSES)
        return -1;
    *class_bytes = base + (size_t)step * quarter;
    return cls;
}

void held_init(struct held_list *h)
{
    *h = (struct held_list){0};
    pthread_mutex_init(&h->lock, NULL);
}

void held_lock(struct held_list *h)
{
    pthread_mutex_lock(&h->lock);
}

void held_unlock(struct held_list *h)
{
    pthread_mutex_unlock(&h->lock);
}

/* The class e can be reused as, or -1. */
static int shelf_class(const struct entry *e)
{
    size_t class_bytes;
    if (e->kind != ENTRY_FREE_DEVICE || e->nptrs != 1 || e->pool ||
        e->held_bytes == 0)
        return -1;
    int cls = size_class_of(e->held_bytes, &class_bytes);
    return cls >= 0 && class_bytes == e->held_bytes ? cls : -1;
}

void held_push_locked(struct held_list *h, struct entry *e)
{
    e->fifo_next = NULL;
    e->held_prev = h->tail;
    if (h->tail != NULL)
        h->tail->fifo_next = e;
    else
        h->head = e;
    h->tail = e;
    h->bytes += e->held_bytes;
    h->count++;
    e->size_class = shelf_class(e);
    e->shelf_prev = NULL;
    e->shelf_next = NULL;
    if (e->size_class >= 0) {
        e->shelf_next = h->shelf[e->size_class];
        if (e->shelf_next != NULL)
            e->shelf_next->shelf_prev = e;
        h->shelf[e->size_class] = e;
    }
}

/* Unlink e from the list and its shelf. */
static void unlink_entry(struct held_list *h, struct entry *e)
{
    if (e->held_prev != NULL)
        e->held_prev->fifo_next = e->fifo_next;
    else
        h->head = e->fifo_next;
    if (e->fifo_next != NULL)
        e->fifo_next->held_prev = e->held_prev;
    else
        h->tail = e->held_prev;
    if (e->size_class >= 0) {
        if (e->shelf_prev != NULL)
            e->shelf_prev->shelf_next = e->shelf_next;
        else
            h->shelf[e->size_class] = e->shelf_next;
        if (e->shelf_next != NULL)
            e->shelf_next->shelf_prev = e->shelf_prev;
    }
    h->bytes -= e->held_bytes;
    h->count--;
    e->fifo_next = e->held_prev = e->shelf_next = e->shelf_prev = NULL;
}

struct entry *held_pop_locked(struct held_list *h)
{
    struct entry *e = h->head;
    if (e != NULL)
        unlink_entry(h, e);
    return e;
}

struct entry *held_take_shelved(struct held_list *h, int cls)
{
    held_lock(h);
    struct entry *e = h->shelf[cls];
    if (e != NULL)
        unlink_entry(h, e);
    held_unlock(h);
    return e;
}
