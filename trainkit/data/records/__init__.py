"""Records and sharing: one copy of the records per machine, metadata files, rank shares."""
