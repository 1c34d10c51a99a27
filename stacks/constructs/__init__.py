"""Small constructs with keyword-only typed properties; the stacks compose them."""
