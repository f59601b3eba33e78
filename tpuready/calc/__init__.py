"""The book's calculators: chips, collectives, plans, rooflines, buckets, packing, alignment,
serving, KV caches."""
