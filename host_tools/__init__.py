# This folder is the package pfcxl.host_tools (see pfcxl/__init__.py): one name per module.
if __name__ != "pfcxl.host_tools":
    raise ImportError(f"import this folder as pfcxl.host_tools, not {__name__}")
