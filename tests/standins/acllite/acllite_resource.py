"""Stand-in of acllite's ``acllite_resource.py`` (reference §4): ``AclLiteResource`` and ``resource_list``."""

import acl

import acllite_utils as utils


class ResourceList:
    """Objects with ``destroy()`` registered by their constructors, destroyed by ``AclLiteResource.__del__``."""

    def __init__(self):
        self.resources = []

    def register(self, obj):
        self.resources.append(obj)

    def unregister(self, obj):
        if obj in self.resources:
            self.resources.remove(obj)

    def destroy(self):
        for obj in list(self.resources):
            obj.destroy()
        self.resources = []


resource_list = ResourceList()


class AclLiteResource:
    def __init__(self, device_id=0):
        self.device_id = device_id
        self.context = None
        self.stream = None
        self.run_mode = None

    def init(self):
        utils.check_ret("acl.init", acl.init())
        utils.check_ret("acl.rt.set_device", acl.rt.set_device(self.device_id))
        self.context, ret = acl.rt.create_context(self.device_id)
        utils.check_ret("acl.rt.create_context", ret)
        self.stream, ret = acl.rt.create_stream()
        utils.check_ret("acl.rt.create_stream", ret)
        self.run_mode, ret = acl.rt.get_run_mode()
        utils.check_ret("acl.rt.get_run_mode", ret)

    def __del__(self):
        resource_list.destroy()
        if self.stream:
            acl.rt.destroy_stream(self.stream)
        if self.context:
            acl.rt.destroy_context(self.context)
        acl.rt.reset_device(self.device_id)
        acl.finalize()
