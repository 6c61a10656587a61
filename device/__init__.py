# This folder is the package pfcxl.device (see pfcxl/__init__.py): one name per module.
if __name__ != "pfcxl.device":
    raise ImportError(f"import this folder as pfcxl.device, not {__name__}")
