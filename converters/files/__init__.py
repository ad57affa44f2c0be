"""npu_deploy.converters.files: the files a deployment reads and writes.

``onnx_model`` (load and validate ONNX, shapes, dynamic gears, node naming), ``bundle`` (the offline
bundle: versioned, checksummed, no pickle), ``om`` (ATC's ``.om`` files read without CANN), ``dump``
(ACL operator dump files), ``feeds`` (the one generator of model inputs nobody gave). May import
``npu_deploy.converters.formats``; nothing above it.
"""
