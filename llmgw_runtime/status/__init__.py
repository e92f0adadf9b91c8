"""The fleet summary: one pure function behind every status view."""
