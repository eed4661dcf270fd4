"""pathtune.codegen.tvm"""
