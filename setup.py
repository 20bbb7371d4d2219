"""paddle-vha: Virtual Head Attention for PaddleFormers' Qwen3. Install with tools/env.sh (pinned venv)."""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def requirements():
    with open(os.path.join(HERE, "requirements.txt")) as f:
        lines = [ln.split("#")[0].strip() for ln in f]
    return [ln for ln in lines if ln and not ln.startswith("pytest")]


setup(
    name="paddle-vha",
    version="0.1.0",
    description="Virtual Head Attention (VHA) for PaddleFormers Qwen3: train, fold to stock GQA, export, serve",
    packages=find_packages(include=["paddle_vha", "paddle_vha.*"]),
    python_requires=">=3.10",
    install_requires=requirements(),
)
