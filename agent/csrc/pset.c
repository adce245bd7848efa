#include "pset.h"

#include "mem.h"

int
hw_pset_init(hw_pset_t *set, size_t capacity)
{
    size_t cap = 16;
    while (cap < capacity) {
        cap *= 2;
    }
    set->slots = hw_calloc(HW_MEM_TRACER, cap, sizeof(void *));
    if (set->slots == NULL) {
        set->mask = 0;
        set->count = 0;
        return -1;
    }
    set->mask = cap - 1;
    set->count = 0;
    return 0;
}

void
hw_pset_fini(hw_pset_t *set)
{
    hw_free(HW_MEM_TRACER, set->slots);
    set->slots = NULL;
    set->mask = 0;
    set->count = 0;
}

size_t
hw_pset_footprint(const hw_pset_t *set)
{
    return set->slots != NULL ? (set->mask + 1) * sizeof(void *) : 0;
}

void *
hw_pset_find(const hw_pset_t *set, uint64_t hash, hw_pset_eq_t eq, const void *key)
{
    for (size_t i = hash & set->mask;; i = (i + 1) & set->mask) {
        void *record = set->slots[i];
        if (record == NULL) {
            return NULL;
        }
        if (hw_record_hash(record) == hash && eq(record, key)) {
            return record;
        }
    }
}

static void
place(void **slots, size_t mask, void *record)
{
    size_t i = hw_record_hash(record) & mask;
    while (slots[i] != NULL) {
        i = (i + 1) & mask;
    }
    slots[i] = record;
}

static int
resize(hw_pset_t *set, size_t capacity)
{
    void **slots = hw_calloc(HW_MEM_TRACER, capacity, sizeof(void *));
    if (slots == NULL) {
        return -1;
    }
    for (size_t i = 0; i <= set->mask; i++) {
        if (set->slots[i] != NULL) {
            place(slots, capacity - 1, set->slots[i]);
        }
    }
    hw_free(HW_MEM_TRACER, set->slots);
    set->slots = slots;
    set->mask = capacity - 1;
    return 0;
}

int
hw_pset_add(hw_pset_t *set, void *record)
{
    if ((set->count + 1) * 4 > (set->mask + 1) * 3) {
        if (resize(set, (set->mask + 1) * 2) < 0) {
            return -1;
        }
    }
    place(set->slots, set->mask, record);
    set->count++;
    return 0;
}

void
hw_pset_remove(hw_pset_t *set, void *record)
{
    size_t i = hw_record_hash(record) & set->mask;
    while (set->slots[i] != record) {
        if (set->slots[i] == NULL) {
            return;
        }
        i = (i + 1) & set->mask;
    }
    size_t j = i;
    for (;;) {
        j = (j + 1) & set->mask;
        if (set->slots[j] == NULL) {
            break;
        }
        size_t k = hw_record_hash(set->slots[j]) & set->mask;
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            set->slots[i] = set->slots[j];
            i = j;
        }
    }
    set->slots[i] = NULL;
    set->count--;
    size_t capacity = set->mask + 1;
    if (capacity > 1024 && set->count * 8 < capacity) {
        (void)resize(set, capacity / 2);
    }
}
