# The students' single-user image for a JupyterHub (zero-to-jupyterhub's singleuser.image, or The
# Littlest JupyterHub with a custom image): the course installed by tools/install.sh, the one
# script `make lab` runs, and nothing else; the venv's Python is the notebooks' kernel. Each
# student's answers live in ~/work (the hub's persistent home), outside the course's checkout
# in /opt/txlearn, so an updated image (or an nbgitpuller pull of the course) never touches them.
#
#   docker build -t txlearn-hub .        # from the repository root
#
# The base image brings JupyterLab and jupyterhub-singleuser (Jupyter Docker Stacks); its
# python3.11 is the interpreter tools/install.sh picks.
FROM quay.io/jupyter/base-notebook:python-3.11

USER root
COPY --chown=${NB_UID}:${NB_GID} . /opt/txlearn
# at every start, before the server: new exercise notebooks into ~/work, answers never changed
COPY tools/hub/txlearn-work.sh /usr/local/bin/before-notebook.d/txlearn-work.sh
USER ${NB_UID}

RUN sh /opt/txlearn/tools/install.sh /opt/txlearn/.venv && \
    /opt/txlearn/.venv/bin/python -m ipykernel install --prefix /opt/conda --name txlearn \
        --display-name "txlearn (Python 3)"

WORKDIR /home/${NB_USER}
