"""Repository-wide pytest set-up, loaded before tests/ and notebooks/."""

import os

# Notebook kernels inherit this: the launcher prints a few stable text lines
# instead of widget state, so nbval compares the same output every time.
os.environ["COURSE_PROGRESS"] = "text"
