/*
 * The snapshot viewer (src/snapshot.ts, compiled to lib/ by tsc) and everything it imports, styles
 * included, as one script that uvm_lab inlines in each snapshot page: no chunks, nothing fetched.
 */
const path = require('path');

module.exports = (env, argv) => ({
  mode: argv.mode === 'development' ? 'development' : 'production',
  devtool: false,
  entry: path.resolve(__dirname, 'lib/snapshot.js'),
  output: {
    path: path.resolve(__dirname, '../uvm_lab/jupyter'),
    filename: 'snapshot_viewer.js',
    iife: true,
    clean: false
  },
  optimization: { splitChunks: false, runtimeChunk: false },
  module: {
    rules: [{ test: /\.css$/, use: ['style-loader', 'css-loader'], type: 'javascript/auto' }]
  },
  performance: { hints: false }
});
