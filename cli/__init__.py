"""npu_deploy.cli: the ``npu-deploy`` command line, a thin shell over the Python API."""
