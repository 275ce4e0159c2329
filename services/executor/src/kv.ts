/** The slice of a KV bucket the executor uses (the result store). */
export interface Kv {
  put(key: string, value: Uint8Array): Promise<number>;
}
