"""Model cards for ONNX models dualloop did not export: `dualloop card init | attach | check`."""
