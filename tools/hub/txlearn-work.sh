#!/bin/sh
# Start hook of the hub image (Dockerfile; Jupyter Docker Stacks run /usr/local/bin/before-notebook.d/*
# before the server): copy new exercise notebooks into the student's ~/work and add new exercises
# to their copies (`txlearn update-work`, what `make work` runs); their answers are never changed.
# ~/work is the hub's persistent home, outside the course in /opt/txlearn.
/opt/txlearn/.venv/bin/txlearn update-work "${TXLEARN_HUB_WORK:-$HOME/work}" || \
    echo "txlearn: could not update ~/work (the notebooks there are as they were)" >&2
