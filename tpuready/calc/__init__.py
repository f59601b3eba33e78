"""The book's calculators: chips, collectives, plans, rooflines, buckets, alignment, serving, KV
caches."""
