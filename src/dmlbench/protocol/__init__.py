"""dmlbench.protocol"""
