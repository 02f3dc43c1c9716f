"""Classroom labs."""
