"""A small function with a sub-package, used by the end-to-end tests."""

from pkg.greeting import greet

print(greet("gantry"))
