"""Builds the student edition (instructor side; not shipped)."""
