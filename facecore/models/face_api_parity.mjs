// A published face-api net run by the package's own JavaScript (tf.js, pure-JS CPU backend), for the
// parity tests of its ports (the torch recognition model, the ONNX detector):
//   node face_api_parity.mjs PACKAGE_DIR NET INPUT.f32 N OUTPUT.f32
// NET: recognition (150x150 faces -> N x 128 descriptors) or detector (224x224 photos -> N x 7 x 7 x 25
// TinyFaceDetector grids).
// INPUT holds N RGB images of float32 pixels in [0, 255] (NHWC); OUTPUT gets the float32 outputs, as
// the net's forward computes them before any decoding. Nothing is downloaded.
import fs from 'fs';

const [, , packageDir, netName, inputPath, count, outputPath] = process.argv;
// The bundle is built for browsers: it stubs node's `util`, so it must not detect node while it
// initialises. tf.js then gets a minimal platform, and face-api an environment without a canvas.
const nodeProcess = globalThis.process;
globalThis.process = undefined;
const faceapi = await import(`${packageDir}/dist/face-api.esm.js`);
globalThis.process = nodeProcess;
const { tf } = faceapi;
tf.setPlatform('node', {
  fetch: globalThis.fetch,
  now: () => performance.now(),
  encode: (text) => new TextEncoder().encode(text),
  decode: (bytes, encoding) => new TextDecoder(encoding).decode(bytes),
  isTypedArray: (value) => ArrayBuffer.isView(value) && !(value instanceof DataView),
});
const unavailable = (what) => () => { throw new Error(`no ${what} in this harness`); };
class None {}
faceapi.env.setEnv({
  Canvas: None, CanvasRenderingContext2D: None, Image: None, ImageData: None, Video: None,
  createCanvasElement: unavailable('canvas'), createImageElement: unavailable('image'),
  createVideoElement: unavailable('video'), fetch: globalThis.fetch, readFile: unavailable('file system'),
});
await tf.setBackend('cpu');
await tf.ready();

const nets = {
  recognition: { file: 'face_recognition_model', size: 150, make: () => new faceapi.FaceRecognitionNet(), run: (net, input) => net.forwardInput(input) },
  detector: { file: 'tiny_face_detector_model', size: 224, make: () => new faceapi.TinyFaceDetector(), run: (net, input) => net.forwardInput(input, 224) },
};
const chosen = nets[netName];
if (!chosen) throw new Error(`unknown net ${netName}: one of ${Object.keys(nets).join(', ')}`);
const manifest = JSON.parse(fs.readFileSync(`${packageDir}/model/${chosen.file}-weights_manifest.json`));
const weights = fs.readFileSync(`${packageDir}/model/${chosen.file}.bin`);
const net = chosen.make();
net.loadFromWeightMap(tf.io.decodeWeights(
  weights.buffer.slice(weights.byteOffset, weights.byteOffset + weights.byteLength), manifest[0].weights,
));
const n = Number(count);
const side = chosen.size;
const pixels = fs.readFileSync(inputPath);
const images = tf.tensor4d(new Float32Array(pixels.buffer, pixels.byteOffset, n * side * side * 3), [n, side, side, 3]);
const output = chosen.run(net, await faceapi.toNetInput(tf.unstack(images)));
fs.writeFileSync(outputPath, Buffer.from((await output.data()).buffer));
console.log(`face-api ${faceapi.version} on tf.js ${tf.version_core} (${tf.getBackend()}): ${netName} on ${n} images`);
