"""One cell run in a Jupyter kernel through a jupyter_client kernel client;
shared by check_kernel.py (on the GPU) and ../check-jupyter.py (on the
stand-in driver)."""


def run_cell(kc, code, timeout=60):
    """Runs `code` in the kernel: its stdout (stripped), and the error's name
    and value if it raised (the reply's error name if no error came)."""
    out, err = [], []

    def hook(msg):
        t, c = msg["msg_type"], msg["content"]
        if t == "stream" and c["name"] == "stdout":
            out.append(c["text"])
        elif t == "error":
            err.append(f"{c['ename']}: {c['evalue']}")

    reply = kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    if reply["content"]["status"] != "ok" and not err:
        err.append(reply["content"].get("ename", "error"))
    return "".join(out).strip(), err
