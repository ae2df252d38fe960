"""Our integration code for host frameworks (see each folder's README)."""
