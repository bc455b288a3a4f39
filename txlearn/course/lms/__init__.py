"""The systems a class already uses: Gradescope's autograder zip and its run, intake of an LMS's
bulk download, and feedback packed for an LMS's bulk upload (one job per module)."""
