"""jupyter_kernel_test's conformance suite against the installed daytona-local spec."""

from __future__ import annotations

import jupyter_kernel_test


class DaytonaLocalConformance(jupyter_kernel_test.KernelTests):
    kernel_name = "daytona-local"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('oops', file=sys.stderr)"
    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "import tomll", "matches": {"tomllib"}},
        {"text": "print(len.__na", "matches": {"__name__"}},
    ]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_generate_error = "raise ValueError('boom')"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(4)]", "result": "[0, 1, 4, 9]"},
        {"code": "'abc'.upper()", "result": "'ABC'"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"},
        {"code": "display({'a': 1}, raw=False)", "mime": "text/plain"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "zip"
    code_page_something = "zip?"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # The first cell waits for the sandbox; the suite's 0.1 s gap rule is about cells after that.
        cls.kc.execute_interactive("pass", timeout=60)
