"""中文教程与英文教程共用 ``tutorials/_tutorial.py``：这里以本文件的路径运行它，使 ``LANG`` 为 "zh"。"""

import pathlib

_shared = pathlib.Path(__file__).resolve().parent.parent / "_tutorial.py"
exec(compile(_shared.read_text(encoding="utf-8"), str(_shared), "exec"))
