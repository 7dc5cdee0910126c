"""Mapping: a record's sample context and failures, and the built-in mappers."""
