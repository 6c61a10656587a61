# This folder is the package pfcxl.guest (see pfcxl/__init__.py): one name per module.
if __name__ != "pfcxl.guest":
    raise ImportError(f"import this folder as pfcxl.guest, not {__name__}")
