"""Layer B: what is legal, and why (property atlas, preservation guide, rules, families)."""
