"""Stand-in of acllite's ``acllite_model.py`` (reference §4), written from its documented behaviour.

``AclLiteModel(path)`` loads the model, creates the desc, pre-allocates the output buffers
(``get_output_size_by_index``, NORMAL_ONLY) and registers itself in ``resource_list``. ``execute`` takes
numpy arrays (copied into per-input device buffers allocated on first use and never freed — acllite's
documented leak) or ``{"data": device_ptr, "size": n}`` dicts (used as they are), appends the
``ascend_mbatch_shape_data`` buffer when the model has one, executes, and returns numpy arrays shaped by
the static ``get_output_dims``; on an ACL error it logs and returns ``None``. ``destroy`` frees the
outputs, unloads the model and destroys the desc.
"""

import numpy as np

import acl

import acllite_utils as utils
import constants as const
from acllite_resource import resource_list

_NP = {const.ACL_FLOAT: np.float32, const.ACL_FLOAT16: np.float16, const.ACL_DOUBLE: np.float64,
       const.ACL_INT8: np.int8, const.ACL_INT16: np.int16, const.ACL_INT32: np.int32,
       const.ACL_INT64: np.int64, const.ACL_UINT16: np.uint16, const.ACL_UINT32: np.uint32,
       const.ACL_UINT64: np.uint64, const.ACL_BOOL: np.uint8, const.ACL_UINT8: np.uint8}
MBATCH = "ascend_mbatch_shape_data"
log = []


class AclLiteModel:
    def __init__(self, model_path, load_type=0):
        self._run_mode, ret = acl.rt.get_run_mode()
        utils.check_ret("acl.rt.get_run_mode", ret)
        self._copy_policy = (const.ACL_MEMCPY_DEVICE_TO_DEVICE if self._run_mode == const.ACL_DEVICE
                             else const.ACL_MEMCPY_HOST_TO_DEVICE)
        self._model_path = model_path
        self._load_type = load_type
        self._model_id = None
        self._model_desc = None
        self._output_dataset = None
        self._input_buffer = []
        self._mbatch = None
        self._is_destroyed = False
        self._init_resource()
        resource_list.register(self)

    def _init_resource(self):
        if self._load_type == 0:
            self._model_id, ret = acl.mdl.load_from_file(self._model_path)
            utils.check_ret("acl.mdl.load_from_file", ret)
        else:
            raise Exception("load_type 1 is not implemented by the stand-in")
        self._model_desc = acl.mdl.create_desc()
        utils.check_ret("acl.mdl.get_desc", acl.mdl.get_desc(self._model_desc, self._model_id))
        self._input_num = acl.mdl.get_num_inputs(self._model_desc)
        self._output_size = acl.mdl.get_num_outputs(self._model_desc)
        self._output_dataset = acl.mdl.create_dataset()
        for i in range(self._output_size):
            size = acl.mdl.get_output_size_by_index(self._model_desc, i)
            ptr, ret = acl.rt.malloc(size, const.ACL_MEM_MALLOC_NORMAL_ONLY)
            utils.check_ret("acl.rt.malloc", ret)
            buf = acl.create_data_buffer(ptr, size)
            _, ret = acl.mdl.add_dataset_buffer(self._output_dataset, buf)
            utils.check_ret("acl.mdl.add_dataset_buffer", ret)
        idx, ret = acl.mdl.get_input_index_by_name(self._model_desc, MBATCH)
        self._mbatch_index = idx if ret == 0 else None

    def _gen_input_dataset(self, input_list):
        dataset = acl.mdl.create_dataset()
        for i, item in enumerate(input_list):
            if isinstance(item, np.ndarray):
                data = np.ascontiguousarray(item)
                size = data.size * data.itemsize
                if i >= len(self._input_buffer):
                    ptr, ret = acl.rt.malloc(size, const.ACL_MEM_MALLOC_NORMAL_ONLY)
                    if ret != 0:
                        return None, ret
                    self._input_buffer.append((ptr, size))
                ptr, bsize = self._input_buffer[i]
                if bsize != size:
                    log.append("input size changed")
                    return None, const.FAILED
                raw = data.tobytes()
                ret = acl.rt.memcpy(ptr, size, acl.util.bytes_to_ptr(raw), size, self._copy_policy)
                if ret != 0:
                    return None, ret
            elif isinstance(item, dict):
                ptr, size = item["data"], item["size"]
            else:
                log.append("unsupported input type")
                return None, const.FAILED
            model_size = acl.mdl.get_input_size_by_index(self._model_desc, i)
            if size != model_size:
                log.append("input %d size %d differs from the model's %d" % (i, size, model_size))
            buf = acl.create_data_buffer(ptr, size)
            _, ret = acl.mdl.add_dataset_buffer(dataset, buf)
            if ret != 0:
                return None, ret
        if self._mbatch_index is not None:
            size = acl.mdl.get_input_size_by_index(self._model_desc, self._mbatch_index)
            if self._mbatch is None:
                ptr, ret = acl.rt.malloc(size, const.ACL_MEM_MALLOC_NORMAL_ONLY)
                if ret != 0:
                    return None, ret
                self._mbatch = ptr
            buf = acl.create_data_buffer(self._mbatch, size)
            acl.mdl.add_dataset_buffer(dataset, buf)
        return dataset, 0

    def execute(self, input_list):
        return self._run(input_list, None)

    def _execute_with_dynamic_batch_size(self, input_list, batch):
        return self._run(input_list, batch)

    def _run(self, input_list, batch):
        dataset, ret = self._gen_input_dataset(input_list)
        if ret != 0:
            log.append("generate input dataset failed ret_int=%d" % ret)
            return None
        try:
            if batch is not None:
                ret = acl.mdl.set_dynamic_batch_size(self._model_id, dataset, self._mbatch_index, batch)
                if ret != 0:
                    log.append("acl.mdl.set_dynamic_batch_size failed ret_int=%d" % ret)
                    return None
            ret = acl.mdl.execute(self._model_id, dataset, self._output_dataset)
            if ret != 0:
                log.append("acl.mdl.execute failed ret_int=%d" % ret)
                return None
            return self._output_dataset_to_numpy()
        finally:
            self._release_dataset(dataset)

    def _output_dataset_to_numpy(self):
        out = []
        for i in range(self._output_size):
            buf = acl.mdl.get_dataset_buffer(self._output_dataset, i)
            ptr = acl.get_data_buffer_addr(buf)
            size = acl.get_data_buffer_size(buf)
            dims, ret = acl.mdl.get_output_dims(self._model_desc, i)
            dtype = _NP.get(acl.mdl.get_output_data_type(self._model_desc, i))
            if ret != 0 or dtype is None:
                return None
            host = bytes(size)
            ret = acl.rt.memcpy(acl.util.bytes_to_ptr(host), size, ptr, size, const.ACL_MEMCPY_DEVICE_TO_HOST)
            if ret != 0:
                return None
            out.append(np.frombuffer(host, dtype=dtype).reshape(tuple(dims["dims"])).copy())
        return out

    def _release_dataset(self, dataset, free_memory=False):
        if not dataset:
            return
        for i in range(acl.mdl.get_dataset_num_buffers(dataset)):
            buf = acl.mdl.get_dataset_buffer(dataset, i)
            if buf:
                if free_memory:
                    acl.rt.free(acl.get_data_buffer_addr(buf))
                acl.destroy_data_buffer(buf)
        acl.mdl.destroy_dataset(dataset)

    def destroy(self):
        if self._is_destroyed:
            return
        self._release_dataset(self._output_dataset, free_memory=True)
        if self._mbatch is not None:
            acl.rt.free(self._mbatch)
            self._mbatch = None
        if self._model_id is not None:
            acl.mdl.unload(self._model_id)
        if self._model_desc:
            acl.mdl.destroy_desc(self._model_desc)
        self._is_destroyed = True
        resource_list.unregister(self)
