"""What stages leave behind for routing and for people: routing directives now; offloaded
values, captured assets and retros as they arrive (the outputs seed)."""
