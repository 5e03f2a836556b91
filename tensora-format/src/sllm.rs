//! The ServerlessLLM (sllm-store) layout: `tensor_index.json` plus `tensor.data_N` partitions.
